//! SIGINT/SIGTERM handling without handlers: the signals are blocked in every
//! thread (the mask is inherited by threads spawned afterwards) and the main thread
//! collects them with sigwait.

pub struct StopSignals {
    set: libc::sigset_t,
}

impl StopSignals {
    /// Blocks SIGINT and SIGTERM for this thread and every thread it spawns later.
    pub fn block() -> std::io::Result<StopSignals> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: set points to a valid sigset_t; the signal numbers are valid.
        let rc = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        Ok(StopSignals { set })
    }

    /// Waits for SIGINT or SIGTERM and names it.
    pub fn wait(&self) -> &'static str {
        loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: self.set is initialised and sig is a valid out-pointer.
            let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
            if rc == 0 {
                return if sig == libc::SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                };
            }
        }
    }
}
