//! Probes pkg-config for SPDK and, with the `spdk` feature, generates the bindings.
//!
//! Without the feature nothing is generated and the crate builds empty
//! (`cfg(spdk_unavailable)`), so a fresh machine builds kvtarget. With the feature:
//! - pkg-config must find `spdk_nvme` and `spdk_env_dpdk` (point PKG_CONFIG_PATH at
//!   SPDK's `build/lib/pkgconfig`), else lib.rs stops the build with one line;
//! - bindgen runs over `wrapper.h` (SPDK's public nvme.h and env.h), and its
//!   `wrap_static_fns` writes C wrappers for SPDK's `static inline` functions,
//!   which `cc` compiles into `libspdk_sys_static_fns.a`;
//! - SPDK's libraries are linked as its pkg-config files ask, wrapped so that its
//!   self-registering modules (transports, the env layer) survive the linker:
//!   `--no-as-needed` for shared libraries, `--whole-archive` for static ones
//!   (`SPDK_STATIC=1`); system libraries come only from
//!   `pkg-config --static --libs spdk_syslibs`.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(spdk_available)");
    println!("cargo::rustc-check-cfg=cfg(spdk_unavailable)");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo::rerun-if-env-changed=SPDK_STATIC");
    println!("cargo::rerun-if-changed=wrapper.h");
    let wanted = std::env::var_os("CARGO_FEATURE_SPDK").is_some();
    let probe = pkg_config::Config::new()
        .cargo_metadata(false)
        .probe("spdk_nvme");
    match (wanted, probe) {
        (true, Ok(nvme)) => {
            #[cfg(feature = "spdk")]
            generate::run(&nvme);
            println!("cargo::rustc-cfg=spdk_available");
            println!("cargo::rustc-env=SPDK_VERSION={}", nvme.version);
        }
        (true, Err(err)) => {
            // lib.rs turns this into the one-line compile error.
            let text = err.to_string();
            let line = text
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or_default()
                .to_string();
            println!("cargo::rustc-cfg=spdk_unavailable");
            println!("cargo::rustc-env=SPDK_VERSION=");
            println!("cargo::rustc-env=SPDK_PROBE_ERROR={line}");
        }
        (false, _) => {
            println!("cargo::rustc-cfg=spdk_unavailable");
            println!("cargo::rustc-env=SPDK_VERSION=");
            println!("cargo::rustc-env=SPDK_PROBE_ERROR=");
        }
    }
}

#[cfg(feature = "spdk")]
mod generate {
    use std::path::PathBuf;

    /// SPDK libraries the backend needs, as pkg-config modules.
    /// `spdk_sock_posix` registers the socket implementation NVMe/TCP needs from a
    /// constructor: nothing references it, so it is named here.
    const MODULES: &[&str] = &["spdk_nvme", "spdk_env_dpdk", "spdk_sock_posix"];

    /// The SPDK functions kvtarget calls (the narrower the allowlist, the fewer
    /// of SPDK's spec structs bindgen must express).
    const FUNCTIONS: &[&str] = &[
        "spdk_env_opts_init",
        "spdk_env_init",
        "spdk_env_fini",
        "spdk_mem_register",
        "spdk_mem_unregister",
        "spdk_vtophys",
        "spdk_nvme_transport_id_parse",
        "spdk_nvme_transport_id_trtype_str",
        // static inline in nvme.h: reached through the cc-compiled wrapper.
        "spdk_nvme_trtype_is_fabrics",
        "spdk_nvme_ctrlr_get_default_ctrlr_opts",
        "spdk_nvme_connect",
        "spdk_nvme_detach",
        "spdk_nvme_ctrlr_is_failed",
        "spdk_nvme_ctrlr_get_data",
        "spdk_nvme_ctrlr_get_num_ns",
        "spdk_nvme_ctrlr_get_ns",
        "spdk_nvme_ctrlr_get_default_io_qpair_opts",
        "spdk_nvme_ctrlr_alloc_io_qpair",
        "spdk_nvme_ctrlr_free_io_qpair",
        "spdk_nvme_ctrlr_process_admin_completions",
        "spdk_nvme_qpair_process_completions",
        "spdk_nvme_qpair_get_failure_reason",
        "spdk_nvme_ns_is_active",
        "spdk_nvme_ns_get_id",
        "spdk_nvme_ns_get_sector_size",
        "spdk_nvme_ns_get_extended_sector_size",
        "spdk_nvme_ns_get_num_sectors",
        "spdk_nvme_ns_get_max_io_xfer_size",
        "spdk_nvme_ns_get_flags",
        "spdk_nvme_ns_get_dealloc_logical_block_read_value",
        "spdk_nvme_ns_cmd_read",
        "spdk_nvme_ns_cmd_write",
        "spdk_nvme_ns_cmd_flush",
        "spdk_nvme_ns_cmd_write_zeroes",
        "spdk_nvme_ns_cmd_dataset_management",
    ];
    const TYPES: &[&str] = &["spdk_nvme_ns_flags", "spdk_nvme_dsm_attribute"];
    const VARS: &[&str] = &[
        "SPDK_NVME_IO_FLAGS_FORCE_UNIT_ACCESS",
        "SPDK_NVME_DATASET_MANAGEMENT_MAX_RANGES",
        "SPDK_NVMF_NQN_MAX_LEN",
        "SPDK_VERSION_STRING",
    ];
    /// Packed NVMe spec structures kept opaque (see the builder).
    const OPAQUE: &[&str] = &[
        "spdk_nvme_ctrlr_data",
        "spdk_nvme_ns_data",
        "spdk_nvme_cpl",
        "spdk_nvme_cmd",
        "spdk_nvme_status",
        "spdk_nvme_dsm_range",
        "spdk_nvme_cap_register",
        // Unions of packed bitfield structs whose size bindgen gets wrong (its
        // layout checks fail): opaque, never read field by field.
        "spdk_nvme_feat_.*",
        "spdk_nvme_cmd_cdw1[0-5]",
    ];

    fn probe(name: &str, statik: bool) -> pkg_config::Library {
        match pkg_config::Config::new()
            .cargo_metadata(false)
            .statik(statik)
            .probe(name)
        {
            Ok(l) => l,
            Err(e) => {
                eprintln!("spdk-sys: pkg-config cannot find `{name}`: {e}");
                std::process::exit(1);
            }
        }
    }

    pub fn run(nvme: &pkg_config::Library) {
        let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
        let statik = std::env::var_os("SPDK_STATIC").is_some();
        let libs: Vec<pkg_config::Library> = MODULES.iter().map(|m| probe(m, statik)).collect();
        let sys = probe("spdk_syslibs", true);

        let includes: Vec<PathBuf> = nvme
            .include_paths
            .iter()
            .chain(libs.iter().flat_map(|l| &l.include_paths))
            .cloned()
            .collect();
        bindings(&out, &includes);
        link(&libs, &sys, statik);
    }

    /// Generates the bindings and compiles the wrappers of SPDK's `static
    /// inline` functions, with SPDK's headers in `includes`.
    fn bindings(out: &std::path::Path, includes: &[PathBuf]) {
        // --- bindings + wrappers for static inline functions -------------------
        let wrap = out.join("spdk_static_fns");
        let mut b = bindgen::Builder::default()
            .header("wrapper.h")
            .derive_default(true)
            .prepend_enum_name(false)
            // Compile-time size/alignment/offset checks for every generated struct,
            // so a header that changes a layout we rely on fails the build.
            .layout_tests(true)
            .wrap_static_fns(true)
            .wrap_static_fns_path(&wrap)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for f in FUNCTIONS {
            b = b.allowlist_function(f);
        }
        for t in TYPES {
            b = b.allowlist_type(t);
        }
        for v in VARS {
            b = b.allowlist_var(v);
        }
        // NVMe spec structures that SPDK declares packed and that contain aligned
        // unions: Rust cannot express a packed type holding a #[repr(align)] one
        // (E0588). They stay opaque blobs of the right size; the safe layer reads
        // the few fields it needs at their spec offsets.
        for t in OPAQUE {
            b = b.opaque_type(t);
        }
        for p in includes {
            b = b.clang_arg(format!("-I{}", p.display()));
        }
        let bindings = match b.generate() {
            Ok(x) => x,
            Err(e) => {
                eprintln!("spdk-sys: bindgen over SPDK's headers failed: {e}");
                std::process::exit(1);
            }
        };
        if let Err(e) = bindings.write_to_file(out.join("bindings.rs")) {
            eprintln!("spdk-sys: writing bindings: {e}");
            std::process::exit(1);
        }
        // bindgen writes the wrapper file only when an allowlisted function is
        // `static inline`.
        let wrappers = wrap.with_extension("c");
        if !wrappers.exists() {
            eprintln!("spdk-sys: bindgen wrote no wrappers for static inline functions");
            std::process::exit(1);
        }
        let mut c = cc::Build::new();
        c.file(wrappers).include(".");
        for p in includes {
            c.include(p);
        }
        c.compile("spdk_sys_static_fns");
    }

    /// Tells cargo (and, through `links` metadata, kvtarget's build.rs) how
    /// to link SPDK's `libs` and the system libraries `sys` they need.
    fn link(libs: &[pkg_config::Library], sys: &pkg_config::Library, statik: bool) {
        // --- linking ---------------------------------------------------------------
        // `rustc-link-arg` reaches only this package's own targets, so the full
        // argument list also goes to dependents as `links` metadata
        // (DEP_SPDK_LINK_ARGS, one argument per line), which kvtarget's build.rs
        // hands to its binaries and tests.
        let mut args: Vec<String> = Vec::new();
        let mut search: Vec<String> = Vec::new();
        for l in libs.iter().chain(std::iter::once(sys)) {
            for p in &l.link_paths {
                let p = p.display().to_string();
                if !search.contains(&p) {
                    search.push(p);
                }
            }
        }
        // System directories last: Debian's libisal has the same SONAME as the
        // ISA-L SPDK built, but lacks symbols SPDK uses (crc64_rocksoft_refl).
        search.sort_by_key(|p| p.starts_with("/usr/") || p.starts_with("/lib"));
        for p in &search {
            println!("cargo::rustc-link-search=native={p}");
            args.push(format!("-L{p}"));
            // RUNPATH, so the binary finds SPDK's libraries without LD_LIBRARY_PATH
            // on the machine that built it.
            if !p.starts_with("/usr/") && !p.starts_with("/lib") {
                args.push(format!("-Wl,-rpath,{p}"));
            }
        }
        let mut spdk_libs: Vec<&str> = Vec::new();
        for l in libs {
            for name in &l.libs {
                if !spdk_libs.contains(&name.as_str()) && !sys.libs.contains(name) {
                    spdk_libs.push(name);
                }
            }
        }
        // Self-registering modules (constructors) must not be dropped by the linker.
        if statik {
            args.push("-Wl,--whole-archive".into());
            args.extend(spdk_libs.iter().map(|n| format!("-l:lib{n}.a")));
            args.push("-Wl,--no-whole-archive".into());
        } else {
            args.push("-Wl,--no-as-needed".into());
            args.extend(spdk_libs.iter().map(|n| format!("-l{n}")));
        }
        // SPDK's shared libraries carry no DT_NEEDED for these, so they are
        // linked (and kept) explicitly.
        args.extend(sys.libs.iter().map(|n| format!("-l{n}")));
        if !statik {
            args.push("-Wl,--as-needed".into());
        }
        for a in &args {
            println!("cargo::rustc-link-arg={a}");
        }
        println!("cargo::metadata=link_args={}", args.join("\\n"));
    }
}
