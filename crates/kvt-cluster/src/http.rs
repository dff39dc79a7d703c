//! The one HTTP exchange the etcd gateway needs: a JSON POST over plain
//! HTTP/1.1 with `Connection: close`, the answer read to its end (sized by
//! `Content-Length`, chunked, or to the close). Blocking, with timeouts, on the
//! cluster thread only.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The largest answer read: a member list of thousands of nodes fits; a
/// runaway peer cannot make the control plane allocate without bound.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// Why an exchange failed before any HTTP status was read.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot resolve {0}")]
    Resolve(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("malformed HTTP answer: {0}")]
    Malformed(&'static str),
    #[error("answer larger than {MAX_RESPONSE_BYTES} bytes")]
    TooLarge,
}

/// An HTTP answer: its status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// POSTs `body` (JSON) to `http://{host_port}{path}`; every socket operation
/// gives up after `timeout`.
pub fn post(
    host_port: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<Answer, HttpError> {
    let addr = host_port
        .to_socket_addrs()
        .map_err(|_| HttpError::Resolve(host_port.into()))?
        .next()
        .ok_or_else(|| HttpError::Resolve(host_port.into()))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host_port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.take(MAX_RESPONSE_BYTES as u64 + 1)
        .read_to_end(&mut raw)?;
    if raw.len() > MAX_RESPONSE_BYTES {
        return Err(HttpError::TooLarge);
    }
    parse_answer(&raw)
}

/// Splits a whole HTTP/1.1 answer into status and (de-chunked) body.
pub fn parse_answer(raw: &[u8]) -> Result<Answer, HttpError> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(HttpError::Malformed("no end of headers"))?;
    let head =
        std::str::from_utf8(&raw[..end]).map_err(|_| HttpError::Malformed("headers not UTF-8"))?;
    let rest = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or(HttpError::Malformed("no status line"))?;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or(HttpError::Malformed("bad status line"))?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if k == "content-length" {
            length = Some(
                v.parse::<usize>()
                    .map_err(|_| HttpError::Malformed("bad Content-Length"))?,
            );
        }
    }
    let body = match (chunked, length) {
        (true, _) => dechunk(rest)?,
        (false, Some(n)) => rest
            .get(..n)
            .ok_or(HttpError::Malformed("body shorter than Content-Length"))?
            .to_vec(),
        (false, None) => rest.to_vec(),
    };
    Ok(Answer { status, body })
}

/// The body of a chunked transfer: each chunk's size line (hex), its bytes,
/// CRLF; a zero size ends it (a close before it ends it too: the gateway's
/// streams end with the connection).
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::new();
    while !rest.is_empty() {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(HttpError::Malformed("chunk size line"))?;
        let size_text =
            std::str::from_utf8(&rest[..eol]).map_err(|_| HttpError::Malformed("chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(size_text, 16).map_err(|_| HttpError::Malformed("chunk size"))?;
        if size == 0 {
            break;
        }
        // Checked: the size is the peer's, up to usize::MAX.
        let data_end = (eol + 2)
            .checked_add(size)
            .ok_or(HttpError::Malformed("chunk size"))?;
        let data = rest
            .get(eol + 2..data_end)
            .ok_or(HttpError::Malformed("chunk shorter than its size"))?;
        out.extend_from_slice(data);
        rest = rest.get(data_end + 2..).unwrap_or(&[]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever a peer sends, the answer parses or is refused: no panic.
        #[test]
        fn any_bytes_parse_or_are_refused(raw in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_answer(&raw);
            let mut with_head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            with_head.extend_from_slice(&raw);
            let _ = parse_answer(&with_head);
        }

        /// A body sent in chunks of any sizes comes back whole.
        #[test]
        fn chunked_bodies_come_back_whole(
            body in proptest::collection::vec(any::<u8>(), 0..2048),
            cuts in proptest::collection::vec(1usize..300, 1..16),
        ) {
            let mut raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            let (mut at, mut i) = (0, 0);
            while at < body.len() {
                let n = cuts[i % cuts.len()].min(body.len() - at);
                raw.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                raw.extend_from_slice(&body[at..at + n]);
                raw.extend_from_slice(b"\r\n");
                at += n;
                i += 1;
            }
            raw.extend_from_slice(b"0\r\n\r\n");
            let a = parse_answer(&raw).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(a.body, body);
        }
    }

    #[test]
    fn a_chunk_size_near_usize_max_is_refused() {
        let raw =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab\r\n";
        assert!(matches!(parse_answer(raw), Err(HttpError::Malformed(_))));
    }

    #[test]
    fn content_length_and_chunked() {
        let a = parse_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, &b"{}"[..]));
        let a = parse_answer(b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n3\r\n\":1\r\n1\r\n}\r\n0\r\n\r\n").unwrap();
        assert_eq!((a.status, a.body.as_slice()), (404, &b"{\"a\":1}"[..]));
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(
            parse_answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err()
        );
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
    }
}
