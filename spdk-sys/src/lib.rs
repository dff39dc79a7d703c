//! Bindings to SPDK. Empty unless built with the `spdk` feature where pkg-config
//! finds SPDK; `AVAILABLE` tells callers which, so the daemon can give a clear error
//! when the `spdk` backend is configured on a build without it. Only kvtarget's
//! `bdev::spdk` module uses these raw bindings.

#[cfg(all(feature = "spdk", spdk_unavailable))]
compile_error!(concat!(
    "feature `spdk` needs SPDK where pkg-config finds spdk_nvme (set PKG_CONFIG_PATH to SPDK's build/lib/pkgconfig): ",
    env!("SPDK_PROBE_ERROR")
));

/// True when this crate was built with SPDK's bindings.
pub const AVAILABLE: bool = cfg!(spdk_available);

/// The SPDK version pkg-config reported, or "" when SPDK was not used.
pub const VERSION: &str = env!("SPDK_VERSION");

#[cfg(spdk_available)]
#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all
)]
pub mod ffi {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}
