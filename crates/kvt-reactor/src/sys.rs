//! The few Linux calls the reactor needs (epoll, eventfd), wrapped once.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub const EPOLLIN: u32 = libc::EPOLLIN as u32;
pub const EPOLLOUT: u32 = libc::EPOLLOUT as u32;
pub const EPOLLRDHUP: u32 = libc::EPOLLRDHUP as u32;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain syscall; the returned fd is owned by the OwnedFd below.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: fd was just created and is not owned elsewhere.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: ev is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    pub fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    pub fn modify(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token)
    }

    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits up to `timeout_ms` (0 = poll, -1 = forever); returns (token, events).
    pub fn wait(&self, out: &mut Vec<(u64, u32)>, timeout_ms: i32) -> io::Result<()> {
        // Not zeroed: this runs on every reactor pass, and the kernel fills the
        // first `n` entries, the only ones read.
        let mut evs = [const { std::mem::MaybeUninit::<libc::epoll_event>::uninit() }; 128];
        // SAFETY: evs is a valid, writable array of 128 epoll_events (MaybeUninit
        // has the same layout), and epoll_wait writes at most that many.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                evs.as_mut_ptr().cast::<libc::epoll_event>(),
                evs.len() as i32,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(e);
        }
        out.clear();
        for ev in &evs[..n as usize] {
            // SAFETY: epoll_wait initialised the first n entries.
            let ev = unsafe { ev.assume_init_read() };
            let (t, e) = (ev.u64, ev.events);
            out.push((t, e));
        }
        Ok(())
    }
}

/// An eventfd used to wake a sleeping reactor.
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall; the fd is owned by the OwnedFd below.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: fd was just created and is not owned elsewhere.
        Ok(EventFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64; a full counter (EAGAIN) still
        // leaves the fd readable, which is all we need.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }

    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a valid u64.
        unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
    }
}

/// How long a control thread rests after a failed poll or accept (EMFILE,
/// say), rather than spin on a listener that stays readable.
pub const CONTROL_ERROR_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Blocks, without a timeout, until one of `fds` is readable or `wake` is
/// signalled; returns whether `wake` was (the caller drains it, or leaves it
/// signalled for every waiter, as a stop is). `ready[i]` says whether
/// `fds[i]` was readable: all false after a signal (EINTR). The control
/// threads (acceptor, RPC, metrics) wait here rather than poll on a timer: an
/// idle one never wakes, so it never takes a core from a reactor or an
/// initiator beside it.
pub fn wait_readable(fds: &[RawFd], wake: &EventFd, ready: &mut Vec<bool>) -> io::Result<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .copied()
        .chain(std::iter::once(wake.raw()))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    ready.clear();
    // SAFETY: pfds is a valid array of pollfd, exclusively borrowed for the call.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
    if n < 0 {
        let e = io::Error::last_os_error();
        ready.resize(fds.len(), false);
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(false),
            _ => Err(e),
        };
    }
    ready.extend(pfds[..fds.len()].iter().map(|p| p.revents != 0));
    Ok(pfds[fds.len()].revents != 0)
}

/// Sets a socket's kernel receive and send buffer sizes (SO_RCVBUF, SO_SNDBUF;
/// the kernel doubles them for its bookkeeping). Setting one fixes it: the
/// kernel no longer auto-tunes that buffer. `None` leaves it auto-tuned.
pub fn set_socket_buffers(fd: RawFd, recv: Option<u32>, send: Option<u32>) -> io::Result<()> {
    for (opt, size) in [(libc::SO_RCVBUF, recv), (libc::SO_SNDBUF, send)] {
        let Some(size) = size else { continue };
        let v = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
        // SAFETY: passes a valid c_int and its size; the kernel only reads it,
        // and a bad fd or option is reported through the return value.
        cvt(unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        })?;
    }
    Ok(())
}

/// Acknowledge received data now instead of after the delayed-ACK timer (40 ms).
/// Linux leaves quick-ACK mode again on its own, so it is set per read burst.
pub fn set_quickack(fd: RawFd) -> io::Result<()> {
    let v: libc::c_int = 1;
    // SAFETY: passes a valid c_int and its size; the kernel only reads it,
    // and a bad fd or option is reported through the return value.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// The cores the calling thread may run on (its affinity mask).
pub fn allowed_cores() -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and its size is passed; the kernel fills it.
    cvt(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) })?;
    let max = libc::CPU_SETSIZE as usize;
    // SAFETY: every index is below CPU_SETSIZE, the set's capacity.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Restricts the calling thread, and every thread it starts afterwards, to
/// `cores` (each below CPU_SETSIZE). A thread may pin itself elsewhere later:
/// the mask is inherited, not a limit.
pub fn set_allowed_cores(cores: &[usize]) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        assert!(
            c < libc::CPU_SETSIZE as usize,
            "core {c} is beyond CPU_SETSIZE"
        );
        // SAFETY: `c` is below CPU_SETSIZE (asserted), within the set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; the kernel only reads it.
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn buffer(fd: RawFd, opt: libc::c_int) -> libc::c_int {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `v` and updates `len`.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &mut v as *mut libc::c_int as *mut libc::c_void,
                &mut len,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        v
    }

    #[test]
    fn socket_buffers_are_set_and_left_alone() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let fd = a.as_raw_fd();
        let (r0, s0) = (buffer(fd, libc::SO_RCVBUF), buffer(fd, libc::SO_SNDBUF));
        set_socket_buffers(fd, None, None).unwrap();
        assert_eq!(
            (buffer(fd, libc::SO_RCVBUF), buffer(fd, libc::SO_SNDBUF)),
            (r0, s0)
        );
        // The kernel doubles what it is given (bookkeeping), within rmem_max/wmem_max.
        set_socket_buffers(fd, Some(64 << 10), Some(96 << 10)).unwrap();
        assert_eq!(buffer(fd, libc::SO_RCVBUF), 128 << 10);
        assert_eq!(buffer(fd, libc::SO_SNDBUF), 192 << 10);
        assert!(set_socket_buffers(-1, Some(4096), None).is_err());
    }

    #[test]
    fn wait_readable_returns_on_a_connection_or_a_wake_and_not_before() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let wake = std::sync::Arc::new(EventFd::new().unwrap());
        let mut ready = Vec::new();
        // A wake from another thread ends the wait with nothing readable.
        let w = wake.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            w.signal();
        });
        let start = std::time::Instant::now();
        assert!(wait_readable(&[l.as_raw_fd()], &wake, &mut ready).unwrap());
        assert!(start.elapsed() >= std::time::Duration::from_millis(40));
        assert_eq!(ready, [false]);
        t.join().unwrap();
        // Left signalled, it ends every wait; drained, a connection does.
        assert!(wait_readable(&[l.as_raw_fd()], &wake, &mut ready).unwrap());
        wake.drain();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(!wait_readable(&[l.as_raw_fd()], &wake, &mut ready).unwrap());
        assert_eq!(ready, [true]);
    }
}
