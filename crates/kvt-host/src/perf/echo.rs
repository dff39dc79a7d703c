//! The same-run baseline for `kvtarget perf`: a plain loopback TCP exchange with
//! the byte volume of an NVMe/TCP workload and none of its processing. A client
//! keeps `qd` requests in flight; a server thread answers each request with a
//! response of fixed size; both busy-poll one core each, like the target and the
//! load generator. What this reaches is what this machine's kernel TCP allows;
//! kvtarget's figures are reported as a ratio of it.

use super::{Histogram, PerfError, PerfReport};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct EchoOptions {
    /// Bytes per request and per response (a 4 KiB read is a 72-byte capsule
    /// answered by a 4120-byte C2HData; a 4 KiB write is the reverse).
    pub request: usize,
    pub response: usize,
    pub qd: usize,
    pub runtime: Duration,
    pub warmup: Duration,
    pub server_cpu: Option<usize>,
    pub client_cpu: Option<usize>,
}

impl EchoOptions {
    /// The byte volume of an NVMe/TCP read or write of `bs` bytes (no digests,
    /// C2H SUCCESS, in-capsule writes up to `icd`).
    pub fn for_io(read: bool, bs: usize, icd: usize) -> (usize, usize) {
        const CAPSULE: usize = 72;
        const DATA_HDR: usize = 24;
        const RESP: usize = 24;
        if read {
            (CAPSULE, DATA_HDR + bs)
        } else if bs <= icd {
            (CAPSULE + bs, RESP)
        } else {
            // Capsule, R2T, H2CData, response: counted as one exchange each way.
            (CAPSULE + DATA_HDR + bs, DATA_HDR + RESP)
        }
    }
}

fn pin(cpu: Option<usize>) -> Result<(), PerfError> {
    match cpu {
        Some(c) if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) => {
            Err(PerfError::EchoCpu(c))
        }
        _ => Ok(()),
    }
}

/// Sends `pending` bytes of zeros without building them per message.
fn send_zeros(s: &mut TcpStream, zeros: &[u8], pending: &mut usize) -> std::io::Result<()> {
    while *pending > 0 {
        match s.write(&zeros[..(*pending).min(zeros.len())]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => *pending -= n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads what is there; returns the bytes read (0 if none), or an error at EOF.
fn recv(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    match s.read(buf) {
        Ok(0) => Err(ErrorKind::UnexpectedEof.into()),
        Ok(n) => Ok(n),
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

fn serve(l: TcpListener, o: &EchoOptions, stop: &AtomicBool) -> Result<(), PerfError> {
    pin(o.server_cpu)?;
    let (mut s, _) = l.accept().map_err(PerfError::EchoAccept)?;
    s.set_nonblocking(true).map_err(PerfError::EchoSocket)?;
    s.set_nodelay(true).map_err(PerfError::EchoSocket)?;
    let mut rbuf = vec![0u8; 1 << 20];
    let zeros = vec![0u8; 1 << 20];
    let (mut partial, mut pending) = (0usize, 0usize);
    while !stop.load(Ordering::Relaxed) {
        match recv(&mut s, &mut rbuf) {
            Ok(n) => {
                partial += n;
                pending += (partial / o.request) * o.response;
                partial %= o.request;
            }
            Err(_) => return Ok(()),
        }
        if send_zeros(&mut s, &zeros, &mut pending).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// Runs the exchange and reports it like a perf run (bytes are response bytes
/// for reads' shape, request bytes otherwise: whichever carries the data).
pub fn run(o: &EchoOptions) -> Result<PerfReport, PerfError> {
    if o.qd == 0 || o.request == 0 || o.response == 0 {
        return Err(PerfError::EchoOptions);
    }
    let l = TcpListener::bind("127.0.0.1:0").map_err(PerfError::EchoBind)?;
    let addr = l.local_addr().map_err(PerfError::EchoSocket)?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let server = sc.spawn(|| serve(l, o, &stop));
        let r = client(addr, o);
        stop.store(true, Ordering::Relaxed);
        let s = server.join().unwrap_or(Err(PerfError::EchoServerPanicked));
        let r = r?;
        s.map(|_| r)
    })
}

fn client(addr: std::net::SocketAddr, o: &EchoOptions) -> Result<PerfReport, PerfError> {
    pin(o.client_cpu)?;
    let mut s = TcpStream::connect(addr).map_err(PerfError::EchoConnect)?;
    s.set_nonblocking(true).map_err(PerfError::EchoSocket)?;
    s.set_nodelay(true).map_err(PerfError::EchoSocket)?;
    let mut rbuf = vec![0u8; 1 << 20];
    let zeros = vec![0u8; 1 << 20];
    let mut issued: VecDeque<Instant> = VecDeque::with_capacity(o.qd);
    let (mut partial, mut pending) = (0usize, 0usize);
    let mut hist = Histogram::default();
    let begin = Instant::now();
    let start = begin + o.warmup;
    let end = start + o.runtime;
    loop {
        let now = Instant::now();
        let stopping = now >= end;
        while !stopping && issued.len() < o.qd {
            issued.push_back(now);
            pending += o.request;
        }
        if stopping && issued.is_empty() {
            break;
        }
        send_zeros(&mut s, &zeros, &mut pending).map_err(PerfError::Send)?;
        let n = recv(&mut s, &mut rbuf).map_err(PerfError::Receive)?;
        if n > 0 {
            partial += n;
            let now = Instant::now();
            while partial >= o.response {
                partial -= o.response;
                let Some(t0) = issued.pop_front() else {
                    return Err(PerfError::EchoExtraResponses);
                };
                if now >= start && now < end {
                    hist.record(now.duration_since(t0).as_nanos() as u64);
                }
            }
        }
        if stopping && now > end + Duration::from_secs(10) {
            return Err(PerfError::EchoMissingResponses);
        }
    }
    Ok(echo_report(o, &hist))
}

/// The report of an echo run from its latencies.
fn echo_report(o: &EchoOptions, hist: &Histogram) -> PerfReport {
    let secs = o.runtime.as_secs_f64();
    let ios = hist.count();
    let us = |ns: u64| ns as f64 / 1000.0;
    let per = o.request.max(o.response) as u64;
    PerfReport {
        ios,
        bytes: ios * per,
        seconds: secs,
        iops: ios as f64 / secs,
        mib_s: (ios * per) as f64 / secs / (1 << 20) as f64,
        mean_us: hist.mean_ns() / 1000.0,
        p50_us: us(hist.quantile_ns(0.50)),
        p90_us: us(hist.quantile_ns(0.90)),
        p99_us: us(hist.quantile_ns(0.99)),
        p999_us: us(hist.quantile_ns(0.999)),
        p9999_us: us(hist.quantile_ns(0.9999)),
        max_us: us(hist.max_ns),
        errors: 0,
        cpu_us_per_io: 0.0,
        verified: 0,
        mismatches: 0,
        mismatch_details: Vec::new(),
        error_details: Vec::new(),
        kv_keys: None,
        misses: 0,
        connect_s: 0.0,
        listed: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_baseline_completes_every_exchange() {
        let (req, resp) = EchoOptions::for_io(true, 4096, 8192);
        assert_eq!((req, resp), (72, 4120));
        let r = run(&EchoOptions {
            request: req,
            response: resp,
            qd: 8,
            runtime: Duration::from_millis(200),
            warmup: Duration::from_millis(50),
            server_cpu: None,
            client_cpu: None,
        })
        .unwrap();
        assert!(r.ios > 0);
        assert!(r.p50_us <= r.max_us);
    }
}
