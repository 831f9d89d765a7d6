//! Compiles the kernel programs of `../ebpf/src` with clang into `OUT_DIR/lmperf_net.bpf.o`,
//! which `net::loader` embeds.
//!
//! A machine without clang (or libbpf's headers) still builds the agent: the object is then
//! empty, `LMPERF_EBPF_BUILD` says why, and the agent reports "probes not built" at start and
//! in `/api/v1/status`. `LMPERF_CLANG` names another clang; `LMPERF_NO_EBPF=1` skips the
//! kernel programs on purpose.
//!
//! It also generates the gRPC control API (`../proto/lmperf/v1/agent.proto`) into `OUT_DIR`:
//! `protox` parses the proto in pure Rust (no `protoc` binary), `tonic-prost-build` writes the
//! messages, the server and the client; likewise the kubelet's pod-resources API
//! (`../proto/kubelet/podresources/v1/api.proto`, upstream's text) for the GPU attribution,
//! and the kubelet's Pods API (`../proto/kubelet/pods/v1alpha1/api.proto`, upstream's text)
//! with the subset of `k8s.io/api` core/v1 `Pod` that discovery decodes its pod bytes into
//! (`../proto/k8s.io/…/generated.proto`, upstream's field numbers).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    if let Err(e) = compile_proto() {
        // The control API is part of the agent: without it the crate cannot build.
        eprintln!("lmperf build: control API proto: {e}");
        std::process::exit(1);
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let src = manifest.join("../ebpf/src");
    let out =
        PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("lmperf_net.bpf.o");
    for f in ["lmperf_net.bpf.c", "lmperf_net.h", "vmlinux.h"] {
        println!("cargo:rerun-if-changed={}", src.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=LMPERF_CLANG");
    println!("cargo:rerun-if-env-changed=LMPERF_NO_EBPF");

    let status = if std::env::var_os("LMPERF_NO_EBPF").is_some_and(|v| v != "0") {
        Err("LMPERF_NO_EBPF was set at build time".to_owned())
    } else {
        compile(&src, &out)
    };
    let note = match status {
        Ok(()) => "built".to_owned(),
        Err(why) => {
            println!(
                "cargo:warning=eBPF probes not built ({why}); the agent will run without them"
            );
            let _ = std::fs::write(&out, b"");
            why
        }
    };
    println!("cargo:rustc-env=LMPERF_EBPF_BUILD={note}");
}

fn compile(src: &std::path::Path, out: &std::path::Path) -> Result<(), String> {
    let clang = std::env::var("LMPERF_CLANG").unwrap_or_else(|_| "clang".to_owned());
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH")
        .unwrap_or_default()
        .as_str()
    {
        "x86_64" => "x86",
        "aarch64" => "arm64",
        "riscv64" => "riscv",
        other => return Err(format!("no eBPF target arch for {other}")),
    };
    let output = Command::new(&clang)
        .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
        .arg(format!("-D__TARGET_ARCH_{arch}"))
        .arg("-I")
        .arg(src)
        .arg("-c")
        .arg(src.join("lmperf_net.bpf.c"))
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|e| format!("{clang} not found: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let first = stderr
            .lines()
            .find(|l| l.contains("error"))
            .unwrap_or("no message")
            .trim()
            .to_owned();
        Err(format!("{clang} failed (libbpf-dev installed?): {first}"))
    }
}

fn compile_proto() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.join("../proto");
    let file = root.join("lmperf/v1/agent.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
    // Maps as BTreeMap and serde on every message: `lmperf ctl --json` prints them as they are.
    tonic_prost_build::configure()
        .build_transport(false)
        .btree_map(".")
        .type_attribute(".lmperf.v1", "#[derive(serde::Serialize)]")
        .compile_fds(fds)?;
    // The kubelet's pod-resources API (upstream proto, unchanged): the client the GPU
    // attribution calls, and the server the tests script.
    let kubelet = root.join("kubelet/podresources/v1/api.proto");
    println!("cargo:rerun-if-changed={}", kubelet.display());
    let fds = protox::compile([&kubelet], [&root])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(fds)?;
    // The kubelet's Pods API (KEP-4188) and the v1.Pod subset its `bytes` decode into: the
    // client discovery runs, and the server the tests script.
    let pods = root.join("kubelet/pods/v1alpha1/api.proto");
    let core = root.join("k8s.io/api/core/v1/generated.proto");
    let meta = root.join("k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto");
    for f in [&pods, &core, &meta] {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile([&pods, &core], [&root])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .btree_map(".k8s.io")
        .compile_fds(fds)?;
    Ok(())
}
