//! `[tcp]`, `[rdma]`, `[discovery]` and `[[listeners]]`: how hosts reach the target.

use super::size::size;
use super::ConfigError;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;

/// Which NVMe-oF transport a listener speaks: the queue's own type, named
/// "tcp" or "rdma" in configuration files.
pub use kvt_nvmf::queue::TransportKind;

/// Entries per queue: NVMe's smallest queue has 2 (CAP.MQES is 0's based and
/// at least 1); 1024 bounds the request slots each queue allocates.
pub const QUEUE_DEPTH: RangeInclusive<u16> = 2..=1024;
/// I/O queues per controller.
pub const IO_QUEUES: RangeInclusive<u16> = 1..=1024;
/// In-capsule data is announced in 16-byte units (IOCCSZ); at most 128 KiB.
pub const IN_CAPSULE_DATA_UNIT: u64 = 16;
pub const IN_CAPSULE_DATA_MAX: u64 = 128 << 10;
/// Largest transfer, a power of two in bytes (MDTS is one): 4 KiB to 32 MiB.
pub const MAX_IO_SIZE: RangeInclusive<u64> = 4096..=(32 << 20);
/// MAXH2CDATA: NVMe/TCP wants a multiple of 4 of at least 4 KiB; 16 MiB caps it.
pub const MAX_H2C_DATA: RangeInclusive<u64> = 4096..=(16 << 20);
/// R2T length: at least 4 KiB; the R2T's R2TL field is 32 bits.
pub const R2T_LENGTH: RangeInclusive<u64> = 4096..=(u32::MAX as u64);
/// Writes a connection asks data for at once.
pub const ACTIVE_R2TS: RangeInclusive<u16> = 1..=256;
/// Kernel socket buffer sizes, in bytes, when not 0 (auto-tuned).
pub const SOCK_BUF: RangeInclusive<u64> = 4096..=(256 << 20);
/// RDMA buffer pool granularity (pages) and most registered memory, in bytes.
pub const RDMA_POOL_UNIT: u64 = 4096;
pub const RDMA_POOL_MAX: u64 = 16 << 30;
/// RDMA READs in flight per queue pair (devices allow far fewer than 128).
pub const RDMA_OUTSTANDING_READS: RangeInclusive<u32> = 1..=128;
/// Queue pairs per reactor and RDMA device.
pub const RDMA_QPAIRS_PER_REACTOR: RangeInclusive<u32> = 1..=4096;
/// NVMe/TCP's and NVMe/RDMA's IANA port.
pub const DEFAULT_PORT: u16 = 4420;

/// Whole commands (1 MiB). 256 KiB windows bring a 4 MiB write's P99 from
/// 1.2x SPDK's nvmf_tgt to parity but cost 1 MiB writes at QD4 17-24 % of
/// their IOPS (bench/RESULTS.md, "The 4 MiB write tail"); a per-connection
/// adaptive window is the open fix.
pub const DEFAULT_R2T_LENGTH: u64 = 1 << 20;
/// Eight: with more, a host spreads its H2CData over every R2T it holds, each
/// command's buffer fills only at the end and leaves the cache before the backend
/// copies it (32 MiB writes: P99 0.96x SPDK's with 8, 1.07x with 32; RESULTS.md).
pub const DEFAULT_ACTIVE_R2TS: u16 = 8;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TcpConfig {
    pub max_queue_depth: u16,
    pub max_io_queues: u16,
    #[serde(deserialize_with = "size")]
    pub in_capsule_data: u64,
    #[serde(deserialize_with = "size")]
    pub max_io_size: u64,
    #[serde(deserialize_with = "size")]
    pub max_h2c_data: u64,
    /// Bytes one R2T asks for (a larger write gets several, in turn).
    #[serde(deserialize_with = "size")]
    pub max_r2t_length: u64,
    /// Writes a connection asks data for at once (1 to 256); the rest wait for
    /// an R2T in arrival order.
    pub max_active_r2ts: u16,
    /// Kernel socket buffers of each connection (SO_RCVBUF / SO_SNDBUF, SPDK's
    /// `sock_impl_set_options` names); 0 leaves them to the kernel's auto-tuning.
    #[serde(deserialize_with = "size")]
    pub recv_buf_size: u64,
    #[serde(deserialize_with = "size")]
    pub send_buf_size: u64,
    pub c2h_success: bool,
    /// Largest C2HData PDU: a longer read's data goes out in PDUs of this
    /// size, and other commands' responses may go between them (a small
    /// read waits for about two of them, not for a whole 32 MiB transfer).
    /// 512 KiB: 128 KiB halved the small reads' P99 beside 32 MiB retrieves
    /// but cost the retrieves a third of their throughput (bench/RESULTS.md,
    /// 2026-12-05); 512 KiB keeps them at SPDK's.
    #[serde(deserialize_with = "size")]
    pub max_c2h_data: u64,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            max_queue_depth: 128,
            max_io_queues: 127,
            in_capsule_data: 8192,
            max_io_size: 1 << 20,
            max_h2c_data: 128 << 10,
            max_r2t_length: DEFAULT_R2T_LENGTH,
            max_active_r2ts: DEFAULT_ACTIVE_R2TS,
            recv_buf_size: 0,
            send_buf_size: 0,
            c2h_success: true,
            max_c2h_data: 512 << 10,
        }
    }
}

impl TcpConfig {
    pub(super) fn validate(&self, f: &str) -> Result<(), ConfigError> {
        if !QUEUE_DEPTH.contains(&self.max_queue_depth) {
            return Err(invalid!(
                "{f}.max_queue_depth",
                "must be 2..=1024 (got {})",
                self.max_queue_depth
            ));
        }
        if !IO_QUEUES.contains(&self.max_io_queues) {
            return Err(invalid!(
                "{f}.max_io_queues",
                "must be 1..=1024 (got {})",
                self.max_io_queues
            ));
        }
        let icd = self.in_capsule_data;
        if icd % IN_CAPSULE_DATA_UNIT != 0 || icd > IN_CAPSULE_DATA_MAX {
            return Err(invalid!(
                "{f}.in_capsule_data",
                "must be a multiple of 16 up to 128KiB (got {icd})"
            ));
        }
        let mio = self.max_io_size;
        if !mio.is_power_of_two() || !MAX_IO_SIZE.contains(&mio) {
            return Err(invalid!(
                "{f}.max_io_size",
                "must be a power of two from 4KiB to 32MiB (got {mio})"
            ));
        }
        let h2c = self.max_h2c_data;
        if h2c % 4 != 0 || !MAX_H2C_DATA.contains(&h2c) {
            return Err(invalid!(
                "{f}.max_h2c_data",
                "must be a multiple of 4 from 4KiB to 16MiB (got {h2c})"
            ));
        }
        let c2h = self.max_c2h_data;
        if c2h % 4 != 0 || !MAX_H2C_DATA.contains(&c2h) {
            return Err(invalid!(
                "{f}.max_c2h_data",
                "must be a multiple of 4 from 4KiB to 16MiB (got {c2h})"
            ));
        }
        if !R2T_LENGTH.contains(&self.max_r2t_length) {
            return Err(invalid!(
                "{f}.max_r2t_length",
                "must be at least 4KiB (got {})",
                self.max_r2t_length
            ));
        }
        for (name, v) in [("recv", self.recv_buf_size), ("send", self.send_buf_size)] {
            if v != 0 && !SOCK_BUF.contains(&v) {
                return Err(invalid!(
                    "{f}.{name}_buf_size",
                    "0 (auto-tuned) or 4KiB to 256MiB (got {v})"
                ));
            }
        }
        if !ACTIVE_R2TS.contains(&self.max_active_r2ts) {
            return Err(invalid!(
                "{f}.max_active_r2ts",
                "1 to 256 (got {})",
                self.max_active_r2ts
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Extra discovery-only port on every listener address (8009 by convention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub address: String,
    #[serde(default = "d_port")]
    pub port: u16,
    /// "tcp" (default) or "rdma".
    #[serde(default, skip_serializing_if = "is_tcp")]
    pub transport: TransportKind,
    /// NVMe/TCP over TLS 1.3 with PSKs only (SPDK's `secure_channel`): a
    /// plaintext connection is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure_channel: bool,
}

fn d_port() -> u16 {
    DEFAULT_PORT
}
fn is_tcp(k: &TransportKind) -> bool {
    *k == TransportKind::Tcp
}

/// NVMe/RDMA sizing. Queue depth, queue count, in-capsule data size and the
/// largest transfer are the `[tcp]` values: Identify Controller and CAP report
/// one set of limits per controller, whatever the transport. Each QP posts one
/// receive buffer of 64 bytes + in-capsule data per queue entry.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RdmaConfig {
    /// Registered memory for RDMA READ/WRITE data, per reactor and RDMA device.
    #[serde(deserialize_with = "size")]
    pub buffer_pool_size: u64,
    /// RDMA READs one queue pair keeps in flight (further capped by the device
    /// and the host's responder resources).
    pub max_outstanding_reads: u32,
    /// QPs one reactor serves on one RDMA device. Each reactor has one
    /// completion queue per device, sized for this many QPs of the largest
    /// queue depth (3 x depth + 16 entries each), capped by the device's
    /// max_cqe; a connection past what the CQ holds is refused.
    pub max_qpairs_per_reactor: u32,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            buffer_pool_size: 64 << 20,
            max_outstanding_reads: 16,
            max_qpairs_per_reactor: 64,
        }
    }
}

impl RdmaConfig {
    /// The pool holds at least one largest transfer of `tcp`.
    pub(super) fn validate(&self, f: &str, tcp: &TcpConfig) -> Result<(), ConfigError> {
        let pool = self.buffer_pool_size;
        if pool % RDMA_POOL_UNIT != 0 || pool < tcp.max_io_size || pool > RDMA_POOL_MAX {
            return Err(invalid!(
                "{f}.buffer_pool_size",
                "must be a multiple of 4KiB from tcp.max_io_size ({}) to 16GiB (got {pool})",
                tcp.max_io_size
            ));
        }
        if !RDMA_OUTSTANDING_READS.contains(&self.max_outstanding_reads) {
            return Err(invalid!(
                "{f}.max_outstanding_reads",
                "must be 1..=128 (got {})",
                self.max_outstanding_reads
            ));
        }
        if !RDMA_QPAIRS_PER_REACTOR.contains(&self.max_qpairs_per_reactor) {
            return Err(invalid!(
                "{f}.max_qpairs_per_reactor",
                "must be 1..=4096 (got {})",
                self.max_qpairs_per_reactor
            ));
        }
        Ok(())
    }
}

/// The addresses of the listeners of one transport.
pub(super) fn listen_addrs_of(
    listeners: &[ListenerConfig],
    kind: TransportKind,
) -> Result<Vec<SocketAddr>, ConfigError> {
    listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| l.transport == kind)
        .map(|(i, l)| {
            let ip: IpAddr = l.address.parse().map_err(|_| {
                invalid!(
                    "listeners[{i}].address",
                    "`{}` is not an IP address",
                    l.address
                )
            })?;
            Ok(SocketAddr::new(ip, l.port))
        })
        .collect()
}

/// Addresses parse, none is listed twice, TLS only on NVMe/TCP, and the
/// discovery port is not also a listener's.
pub(super) fn validate_listeners(
    listeners: &[ListenerConfig],
    discovery: &DiscoveryConfig,
) -> Result<(), ConfigError> {
    let rdma = listen_addrs_of(listeners, TransportKind::Rdma)?;
    if let Some(i) = listeners
        .iter()
        .position(|l| l.secure_channel && l.transport == TransportKind::Rdma)
    {
        return Err(invalid!(
            "listeners[{i}].secure_channel",
            "TLS is NVMe/TCP's; an RDMA listener cannot require it"
        ));
    }
    for (i, a) in rdma.iter().enumerate() {
        if rdma[..i].contains(a) {
            return Err(invalid!("listeners", "RDMA listener {a} is listed twice"));
        }
    }
    let addrs = listen_addrs_of(listeners, TransportKind::Tcp)?;
    for (i, a) in addrs.iter().enumerate() {
        if addrs[..i].contains(a) {
            return Err(invalid!("listeners[{i}]", "{a} is listed twice"));
        }
        if a.port() != 0 && Some(a.port()) == discovery.port {
            return Err(invalid!(
                "discovery.port",
                "{} is also listeners[{i}].port",
                a.port()
            ));
        }
    }
    Ok(())
}
