//! With the `spdk` feature, links this crate's tests against SPDK the way
//! `spdk-sys` worked out: its `links` metadata (DEP_SPDK_LINK_ARGS, one argument
//! per line), since `rustc-link-arg` from a dependency does not reach this
//! package's targets. Without the feature the variable is not set.
fn main() {
    println!("cargo::rerun-if-env-changed=DEP_SPDK_LINK_ARGS");
    if let Ok(args) = std::env::var("DEP_SPDK_LINK_ARGS") {
        for a in args.split("\\n").filter(|a| !a.is_empty()) {
            println!("cargo::rustc-link-arg={a}");
        }
    }
}
