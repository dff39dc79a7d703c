//! The service manager's watchdog, fed by the reactors' own liveness.
//!
//! A reactor that stops passing through its loop stalls every queue it
//! owns, while the process looks alive to anything outside. So `WATCHDOG=1`
//! is sent only while every reactor keeps completing passes: a healthy
//! reactor completes one at least every ~100 ms even when idle (its longest
//! epoll sleep, `MAX_SLEEP_MS`, and its housekeeping timer), and each pass is
//! counted in its stall histogram (`reactor::stall`). When one reactor's
//! count stands still for `stuck_after`, the pings stop and the manager
//! restarts the service once `WatchdogSec=` runs out.

use super::notify::Notifier;
use kvt_reactor::ReactorShared;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The least time a reactor may go without a pass before it counts as
/// stuck, whatever the manager's timeout: ten times the longest an idle,
/// healthy reactor sleeps between two passes (100 ms).
pub const MIN_STUCK_AFTER: Duration = Duration::from_secs(1);

/// When to ping and when to give up on a reactor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchdogSettings {
    /// How often liveness is checked and, when every reactor is alive,
    /// `WATCHDOG=1` sent.
    pub ping_every: Duration,
    /// How long a reactor may go without completing a pass of its loop.
    pub stuck_after: Duration,
}

impl WatchdogSettings {
    /// For the manager's timeout `t` (`WatchdogSec=`): pings every t/4 (the
    /// manager asks for at least every t/2; a quarter leaves room for a late
    /// check), and a reactor is stuck after t/2 without a pass (at least
    /// `MIN_STUCK_AFTER`). A reactor stuck at time s gets its last ping by
    /// s + t/2, so the manager acts by s + 3t/2: within 15 s for the unit's
    /// `WatchdogSec=10s`.
    pub fn for_timeout(t: Duration) -> WatchdogSettings {
        WatchdogSettings {
            ping_every: t / 4,
            stuck_after: (t / 2).max(MIN_STUCK_AFTER),
        }
    }
}

/// A reactor that has not completed a pass for too long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stuck {
    pub reactor: usize,
    /// Since its pass count last moved.
    pub for_: Duration,
}

/// The liveness judgement, apart from threads and clocks: each reactor's pass
/// count and when it last moved.
#[derive(Debug)]
pub struct Liveness {
    stuck_after: Duration,
    /// Per reactor: passes as last seen, and when that count was first seen.
    seen: Vec<(u64, Instant)>,
}

impl Liveness {
    pub fn new(stuck_after: Duration) -> Liveness {
        Liveness {
            stuck_after,
            seen: Vec::new(),
        }
    }

    /// Takes the reactors' pass counts at `now`; the first reactor stuck for
    /// longer than the bound, if any.
    pub fn observe(&mut self, passes: &[u64], now: Instant) -> Option<Stuck> {
        // Reactors are fixed for the target's life: the first look sets the
        // table, a later one of another length starts it again.
        if self.seen.len() != passes.len() {
            self.seen = passes.iter().map(|&p| (p, now)).collect();
        }
        let mut stuck = None;
        for (reactor, (&p, seen)) in passes.iter().zip(self.seen.iter_mut()).enumerate() {
            if p != seen.0 {
                *seen = (p, now);
                continue;
            }
            let for_ = now.saturating_duration_since(seen.1);
            if for_ > self.stuck_after && stuck.is_none() {
                stuck = Some(Stuck { reactor, for_ });
            }
        }
        stuck
    }
}

/// The thread that checks the reactors and pings the manager.
pub struct Watchdog {
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts checking `reactors` and pinging through `notifier`.
    pub fn start(
        notifier: Arc<Notifier>,
        reactors: Vec<Arc<ReactorShared>>,
        settings: WatchdogSettings,
    ) -> std::io::Result<Watchdog> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || run(&notifier, &reactors, settings, &rx))?;
        Ok(Watchdog {
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// Stops pinging (a stopping service is timed by `TimeoutStopSec=`).
    pub fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

fn passes(reactors: &[Arc<ReactorShared>]) -> Vec<u64> {
    reactors
        .iter()
        .map(|r| r.stall.snapshot().gap_count())
        .collect()
}

fn run(
    notifier: &Notifier,
    reactors: &[Arc<ReactorShared>],
    settings: WatchdogSettings,
    stop: &Receiver<()>,
) {
    let mut liveness = Liveness::new(settings.stuck_after);
    let mut withheld = false;
    loop {
        match liveness.observe(&passes(reactors), Instant::now()) {
            None => {
                if withheld {
                    tracing::warn!(
                        "every reactor is passing through its loop again; watchdog pings resumed"
                    );
                    withheld = false;
                }
                if let Err(e) = notifier.send("WATCHDOG=1") {
                    tracing::warn!("{e}");
                }
            }
            Some(s) => {
                if !withheld {
                    tracing::error!(
                        reactor = s.reactor,
                        stuck_ms = s.for_.as_millis() as u64,
                        "reactor stuck: no pass of its loop for longer than the watchdog bound; withholding the watchdog ping so the service manager restarts the target"
                    );
                    let status = format!(
                        "STATUS=reactor {} stuck for {} ms; watchdog pings withheld",
                        s.reactor,
                        s.for_.as_millis()
                    );
                    if let Err(e) = notifier.send(&status) {
                        tracing::warn!("{e}");
                    }
                    withheld = true;
                }
            }
        }
        match stop.recv_timeout(settings.ping_every) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_follow_the_managers_timeout() {
        let s = WatchdogSettings::for_timeout(Duration::from_secs(10));
        assert_eq!(s.ping_every, Duration::from_millis(2500));
        assert_eq!(s.stuck_after, Duration::from_secs(5));
        // A short timeout never calls an idle reactor stuck.
        let s = WatchdogSettings::for_timeout(Duration::from_millis(400));
        assert_eq!(s.stuck_after, MIN_STUCK_AFTER);
    }

    #[test]
    fn a_reactor_whose_count_stands_still_is_stuck_and_recovers() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut l = Liveness::new(ms(500));
        assert_eq!(l.observe(&[1, 1], t0), None);
        assert_eq!(l.observe(&[5, 9], t0 + ms(300)), None);
        // Reactor 1 stops at 9; reactor 0 goes on.
        assert_eq!(l.observe(&[8, 9], t0 + ms(700)), None, "400 ms still");
        assert_eq!(
            l.observe(&[12, 9], t0 + ms(900)),
            Some(Stuck {
                reactor: 1,
                for_: ms(600)
            })
        );
        assert_eq!(l.observe(&[13, 10], t0 + ms(1000)), None, "it moved");
    }

    #[test]
    fn a_reactor_is_judged_from_its_first_look() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_millis(100));
        assert_eq!(l.observe(&[0], t0), None);
        assert!(l.observe(&[0], t0 + Duration::from_millis(150)).is_some());
    }
}
