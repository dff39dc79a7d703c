//! Many-seed simulation runs spread over the machine's cores. Each seed is a
//! world of its own (its own simulated devices, pools and clock), so CI's
//! thousands of seeds take about half the time on two cores instead of
//! leaving one idle.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Runs `run(seed)` for every seed of `first..first + count`, on one thread
/// per core (`KVT_SIM_THREADS=N` sets the number), and returns the results in
/// seed order. When a seed panics the others stop taking new seeds and this
/// panics naming it (the seed's own message is printed above by the panic
/// hook).
pub fn run_seeds<C: Send>(first: u64, count: u64, run: impl Fn(u64) -> C + Sync) -> Vec<C> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let threads = std::env::var("KVT_SIM_THREADS")
        .ok()
        .and_then(|s| s.parse().ok());
    let workers = threads.unwrap_or(cores).min(count).max(1);
    let next = AtomicU64::new(first);
    let failed = AtomicBool::new(false);
    let worker = || -> Result<Vec<(u64, C)>, u64> {
        let mut done = Vec::new();
        loop {
            let seed = next.fetch_add(1, Ordering::Relaxed);
            if seed >= first + count || failed.load(Ordering::Relaxed) {
                return Ok(done);
            }
            match catch_unwind(AssertUnwindSafe(|| run(seed))) {
                Ok(c) => done.push((seed, c)),
                Err(_) => {
                    failed.store(true, Ordering::Relaxed);
                    return Err(seed);
                }
            }
        }
    };
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers).map(|_| s.spawn(worker)).collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut all = Vec::with_capacity(count as usize);
    let mut failures = Vec::new();
    for o in outcomes {
        match o {
            Ok(Ok(done)) => all.extend(done),
            Ok(Err(seed)) => failures.push(seed),
            Err(_) => panic!("a simulation worker died outside any seed"),
        }
    }
    if let Some(seed) = failures.iter().min() {
        panic!("seed {seed} failed (rerun it alone with its simulation's _SEED variable)");
    }
    all.sort_by_key(|(seed, _)| *seed);
    all.into_iter().map(|(_, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_runs_once_and_results_come_in_seed_order() {
        let got = run_seeds(10, 50, |seed| seed * 2);
        assert_eq!(got, (10..60).map(|s| s * 2).collect::<Vec<_>>());
    }

    #[test]
    fn a_failing_seed_is_named() {
        let r = catch_unwind(|| {
            run_seeds(0, 20, |seed| {
                assert_ne!(seed, 7, "seed 7 is bad");
                seed
            })
        });
        let msg = r
            .err()
            .and_then(|p| p.downcast::<String>().ok())
            .map(|s| *s);
        assert_eq!(
            msg.as_deref(),
            Some("seed 7 failed (rerun it alone with its simulation's _SEED variable)")
        );
    }
}
