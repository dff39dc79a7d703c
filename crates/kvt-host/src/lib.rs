//! Host-side tools: kvtarget's own NVMe/TCP initiator (`initiator`, used by
//! the integration tests and `perf`) and the `kvtarget perf` load generator.

pub mod initiator;
pub mod perf;
