//! With the `spdk` feature, links kvtarget's binaries and tests against SPDK
//! the way `spdk-sys` worked out (its `links` metadata: `rustc-link-arg` from a
//! dependency does not reach this package's targets). The git commit the
//! binary reports is recorded by kvt-nvmf's build.rs.
fn main() {
    println!("cargo::rerun-if-env-changed=DEP_SPDK_LINK_ARGS");
    if std::env::var_os("CARGO_FEATURE_SPDK").is_some() {
        if let Ok(args) = std::env::var("DEP_SPDK_LINK_ARGS") {
            for a in args.split("\\n").filter(|a| !a.is_empty()) {
                println!("cargo::rustc-link-arg={a}");
            }
        }
    }
}
