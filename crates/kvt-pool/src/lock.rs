//! The advisory lock on a pool's file or block device, held while a target or
//! a tool uses the pool so two processes never write the same metadata.

use super::PoolError;

/// An advisory lock on a pool's file or block device, held while a target or a
/// tool uses the pool so two processes never write the same metadata.
pub struct PoolLock {
    _file: std::fs::File,
}

/// Takes the pool lock: exclusive for a user that writes, shared for `check`.
pub fn lock_pool(path: &std::path::Path, exclusive: bool) -> Result<PoolLock, PoolError> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).map_err(|e| PoolError::Lock {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    } | libc::LOCK_NB;
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), op) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            PoolError::Locked {
                path: path.display().to_string(),
            }
        } else {
            PoolError::Lock {
                path: path.display().to_string(),
                reason: format!("cannot lock: {e}"),
            }
        });
    }
    Ok(PoolLock { _file: file })
}
