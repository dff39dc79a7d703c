//! Probes pkg-config for SPDK. Where SPDK is installed this is where bindgen will
//! run over its public headers (the `spdk` backend issue); elsewhere the crate builds
//! empty and says so with `cfg(spdk_unavailable)`, so a fresh machine builds kvtarget.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(spdk_available)");
    println!("cargo::rustc-check-cfg=cfg(spdk_unavailable)");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    let required = std::env::var_os("CARGO_FEATURE_SPDK").is_some();
    match pkg_config::Config::new()
        .cargo_metadata(false)
        .probe("spdk_nvme")
    {
        Ok(lib) => {
            println!("cargo::rustc-cfg=spdk_available");
            println!("cargo::rustc-env=SPDK_VERSION={}", lib.version);
        }
        Err(err) => {
            if required {
                panic!(
                    "feature `spdk` needs SPDK installed where pkg-config finds `spdk_nvme`: {err}"
                );
            }
            println!("cargo::rustc-cfg=spdk_unavailable");
            println!("cargo::rustc-env=SPDK_VERSION=");
        }
    }
}
