//! Bindings to SPDK. Empty unless SPDK was found at build time; `AVAILABLE` tells
//! callers which, so the daemon can give a clear error when the `spdk` backend is
//! configured on a build without it.

/// True when pkg-config found SPDK while this crate was built.
pub const AVAILABLE: bool = cfg!(spdk_available);

/// The SPDK version pkg-config reported, or "" when SPDK was not found.
pub const VERSION: &str = env!("SPDK_VERSION");
