//! `kvtarget top`: a live view of a running target over its RPC socket, in
//! the spirit of SPDK's `spdk_top`: reactors (busy share, stalls, queue
//! pairs), namespaces (IOPS, bandwidth, P99 latency), pools (fill, GC), KV
//! namespaces (hits, misses, evictions) and, on a cluster member, its role
//! per ANA group. It refreshes in place on a terminal (q quits) or, with
//! `--once`, prints one plain snapshot with rates over one interval.
//!
//! A module of the binary, not of a library crate: only `main` uses it, as it
//! does the other RPC clients (`rpc`, `cluster status`), and so its terminal
//! handling (rustix) stays out of the libraries the server and tests link.

pub mod sample;
pub mod term;
pub mod view;

use kvtarget::rpc::{RpcClient, RpcError, SocketError};
use sample::Sample;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// Shortest refresh interval: a look is six RPC calls.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// What `kvtarget top` was asked for.
#[derive(Debug, Clone)]
pub struct TopOptions {
    pub socket: PathBuf,
    pub interval: Duration,
    /// One plain snapshot: two looks `interval` apart, printed once.
    pub once: bool,
}

/// Why `kvtarget top` stopped; one line.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("{0} (is the target running? -r sets the socket)")]
    Connect(#[source] SocketError),
    #[error("{method}: error {}: {}", .error.code, .error.message)]
    Rpc {
        method: &'static str,
        error: RpcError,
    },
    #[error("{method}: unexpected answer: {source}")]
    Answer {
        method: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("standard output is not a terminal; use --once for a plain snapshot")]
    NotATerminal,
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
}

/// Runs the view until q (or, with `--once`, for one interval).
pub fn run(opts: &TopOptions) -> Result<(), TopError> {
    let mut client = RpcClient::connect(&opts.socket).map_err(TopError::Connect)?;
    let every = opts.interval.max(MIN_INTERVAL);
    if opts.once {
        let first = Sample::fetch(&mut client)?;
        std::thread::sleep(every);
        let second = Sample::fetch(&mut client)?;
        let mut out = std::io::stdout().lock();
        for l in view::render(Some(&first), &second, every.as_secs_f64()) {
            use std::io::Write;
            // A reader that went away (`| head`) ends the output.
            if writeln!(out, "{l}").is_err() {
                break;
            }
        }
        return Ok(());
    }
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(TopError::NotATerminal);
    }
    let screen = term::Screen::enter()?;
    let mut prev: Option<Sample> = None;
    loop {
        let cur = Sample::fetch(&mut client)?;
        screen.draw(&view::render(prev.as_ref(), &cur, every.as_secs_f64()))?;
        prev = Some(cur);
        // Keys other than q wait out the rest of the interval.
        let deadline = std::time::Instant::now() + every;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            if screen.key(left)? == Some(term::Key::Quit) {
                return Ok(());
            }
        }
    }
}
