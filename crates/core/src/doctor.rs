//! `kiln doctor`: the versions and settings that decide performance, as one report — the
//! checklist's first item ("check the versions … and the system").

use serde::{Deserialize, Serialize};

/// CUDA facts (CUDA builds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaReport {
    /// Whether a device could be created and used.
    pub available: bool,
    /// Why not, when unavailable.
    pub error: Option<String>,
    /// NVIDIA driver version (NVML).
    pub driver_version: Option<String>,
    /// CUDA driver API version (NVML), e.g. `12.4`.
    pub cuda_version: Option<String>,
    /// GPU names and memory.
    pub gpus: Vec<String>,
}

/// The report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoctorReport {
    /// kiln's version.
    pub kiln_version: String,
    /// Burn's version (from Cargo.lock at build time).
    pub burn_version: String,
    /// The rustc that built kiln.
    pub rustc: String,
    /// Target triple.
    pub target: String,
    /// Cargo profile of this build.
    pub build_profile: String,
    /// Enabled cargo features.
    pub features: Vec<String>,
    /// Backends compiled in.
    pub backends: Vec<String>,
    /// The device `kiln train` uses by default.
    pub default_device: String,
    /// CPU model name.
    pub cpu_model: String,
    /// Logical cores available to this process.
    pub logical_cores: usize,
    /// Physical cores (distinct core ids).
    pub physical_cores: Option<usize>,
    /// rayon's thread count (used by the flex backend and the CPU engines).
    pub rayon_threads: usize,
    /// Thread-related environment variables that are set.
    pub thread_env: Vec<String>,
    /// Operating system and kernel.
    pub os: String,
    /// Total memory, MiB.
    pub memory_total_mb: Option<u64>,
    /// CUDA facts; `null` on builds without the `cuda` feature.
    pub cuda: Option<CudaReport>,
}

fn cpuinfo() -> (String, Option<usize>) {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = text
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let mut cores = std::collections::BTreeSet::new();
    let mut phys = String::new();
    for l in text.lines() {
        if let Some(v) = l.strip_prefix("physical id") {
            phys = v.trim_start_matches([' ', '\t', ':']).to_string();
        }
        if let Some(v) = l.strip_prefix("core id") {
            cores.insert((
                phys.clone(),
                v.trim_start_matches([' ', '\t', ':']).to_string(),
            ));
        }
    }
    (model, (!cores.is_empty()).then_some(cores.len()))
}

fn memory_total_mb() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024)
}

#[cfg(feature = "cuda")]
fn cuda_report() -> Option<CudaReport> {
    let probe = crate::backend::cuda_probe();
    let mut r = CudaReport {
        available: probe.is_ok(),
        error: probe.err().map(|e| e.to_string()),
        driver_version: None,
        cuda_version: None,
        gpus: Vec::new(),
    };
    if let Ok(nvml) = nvml_wrapper::Nvml::init() {
        r.driver_version = nvml.sys_driver_version().ok();
        r.cuda_version = nvml
            .sys_cuda_driver_version()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
        let n = nvml.device_count().unwrap_or(0);
        for i in 0..n {
            if let Ok(d) = nvml.device_by_index(i) {
                let name = d.name().unwrap_or_else(|_| "unknown".into());
                let mem = d
                    .memory_info()
                    .map(|m| m.total / (1024 * 1024))
                    .unwrap_or(0);
                r.gpus.push(format!("{name} ({mem} MiB)"));
            }
        }
    }
    Some(r)
}

#[cfg(not(feature = "cuda"))]
fn cuda_report() -> Option<CudaReport> {
    None
}

/// Where one CUDA library was looked for and what was found (`kiln doctor --gpu`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LibrarySearch {
    /// The library, e.g. `libnvrtc`.
    pub library: String,
    /// The file names looked for, in order of preference.
    pub names: Vec<String>,
    /// The directories looked in, in order.
    pub dirs: Vec<String>,
    /// The first file found (a name of `names` in one of `dirs`).
    pub found: Option<String>,
    /// Whether the dynamic loader opened the found file (`dlopen` by its path), or why not.
    pub loadable: Option<Result<(), String>>,
}

/// The CUDA driver library and NVRTC (what Burn's CUDA backend loads at run time).
pub const CUDA_LIBRARIES: [(&str, &[&str]); 2] = [
    ("libcuda", &["libcuda.so.1", "libcuda.so"]),
    (
        "libnvrtc",
        &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
    ),
];

/// The directories searched for CUDA libraries, in order: `LD_LIBRARY_PATH`, `CUDA_HOME` /
/// `CUDA_PATH` (`lib64`, `lib`), the CUDA toolkit's usual places (`/usr/local/cuda*/lib64`,
/// `targets/x86_64-linux/lib`), the NVIDIA container runtime's (`/usr/local/nvidia/lib64`),
/// the system library directories, the directories `ldconfig -p` names for the libraries,
/// and the `nvidia/*/lib` directories of Python site-packages (PyTorch's pip wheels ship
/// `nvidia-cuda-nvrtc` there). `var` reads the environment.
pub fn cuda_search_dirs(var: &dyn Fn(&str) -> Option<String>) -> Vec<std::path::PathBuf> {
    use std::path::PathBuf;
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut push = |d: PathBuf| {
        if !d.as_os_str().is_empty() && !dirs.contains(&d) {
            dirs.push(d);
        }
    };
    for d in var("LD_LIBRARY_PATH").unwrap_or_default().split(':') {
        push(PathBuf::from(d));
    }
    for v in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = var(v).filter(|r| !r.is_empty()) {
            push(PathBuf::from(&root).join("lib64"));
            push(PathBuf::from(&root).join("lib"));
        }
    }
    let mut toolkits = vec![PathBuf::from("/usr/local/cuda")];
    toolkits.extend(sorted_children(std::path::Path::new("/usr/local"), |n| {
        n.starts_with("cuda-")
    }));
    for t in toolkits {
        push(t.join("lib64"));
        push(t.join("targets/x86_64-linux/lib"));
    }
    for d in [
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/lib/wsl/lib",
    ] {
        push(PathBuf::from(d));
    }
    for d in ldconfig_dirs() {
        push(d);
    }
    for site in site_packages(var) {
        for pkg in sorted_children(&site.join("nvidia"), |_| true) {
            push(pkg.join("lib"));
        }
    }
    dirs
}

/// The children of `dir` whose names pass `keep`, sorted.
fn sorted_children(dir: &std::path::Path, keep: impl Fn(&str) -> bool) -> Vec<std::path::PathBuf> {
    let mut out: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| keep(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Directories of the CUDA libraries in the loader's cache (`ldconfig -p`), if it runs.
fn ldconfig_dirs() -> Vec<std::path::PathBuf> {
    let Ok(out) = std::process::Command::new("ldconfig").arg("-p").output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("libcuda.so") || l.contains("libnvrtc.so"))
        .filter_map(|l| l.rsplit_once("=> "))
        .filter_map(|(_, p)| {
            std::path::Path::new(p.trim())
                .parent()
                .map(|d| d.to_path_buf())
        })
        .collect()
}

/// Python site-packages directories: the system's and `/usr/local`'s, conda's, the active
/// virtualenv's and the user's.
fn site_packages(var: &dyn Fn(&str) -> Option<String>) -> Vec<std::path::PathBuf> {
    use std::path::PathBuf;
    let mut roots = vec![
        PathBuf::from("/usr/lib"),
        PathBuf::from("/usr/local/lib"),
        PathBuf::from("/opt/conda/lib"),
    ];
    for v in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(r) = var(v).filter(|r| !r.is_empty()) {
            roots.push(PathBuf::from(r).join("lib"));
        }
    }
    if let Some(home) = var("HOME").filter(|h| !h.is_empty()) {
        roots.push(PathBuf::from(home).join(".local/lib"));
    }
    let mut out = Vec::new();
    for root in roots {
        for py in sorted_children(&root, |n| n.starts_with("python3")) {
            for sub in ["site-packages", "dist-packages"] {
                let d = py.join(sub);
                if d.is_dir() {
                    out.push(d);
                }
            }
        }
    }
    out
}

/// Look for each of [`CUDA_LIBRARIES`] in `dirs` (a name before the next one, a directory
/// before the next; a toolkit stub last) and try to load what is found.
pub fn find_cuda_libraries(dirs: &[std::path::PathBuf]) -> Vec<LibrarySearch> {
    CUDA_LIBRARIES
        .iter()
        .map(|(library, names)| {
            // A toolkit's link stub (`…/stubs/libcuda.so`) only when nothing else is there:
            // it loads, but there is no driver behind it.
            let candidates = || {
                names
                    .iter()
                    .flat_map(|n| dirs.iter().map(move |d| d.join(n)))
                    .filter(|p| p.is_file())
            };
            let found = candidates()
                .find(|p| !is_stub(p))
                .or_else(|| candidates().next());
            LibrarySearch {
                library: library.to_string(),
                names: names.iter().map(|n| n.to_string()).collect(),
                dirs: dirs.iter().map(|d| d.display().to_string()).collect(),
                loadable: found.as_deref().map(crate::backend::dlopen),
                found: found.map(|p| p.display().to_string()),
            }
        })
        .collect()
}

/// The `libcuda` the dynamic loader would take by its soname: the first `libcuda.so.1` in the
/// `LD_LIBRARY_PATH` directories (`ld_library_path`, colon-separated), in order; `None` when
/// none holds one (the loader then goes on to its cache and the system directories).
pub fn libcuda_on_library_path(ld_library_path: &str) -> Option<std::path::PathBuf> {
    ld_library_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| std::path::Path::new(d).join("libcuda.so.1"))
        .find(|p| p.exists())
}

/// Whether `path` is a CUDA toolkit's link stub (a directory named `stubs` on its way):
/// loadable, but with no driver behind it.
pub fn is_stub(path: &std::path::Path) -> bool {
    path.components().any(|c| c.as_os_str() == "stubs")
}

/// Warnings about the CUDA driver library: the loader would take a toolkit stub (from
/// `LD_LIBRARY_PATH`), or the search found only a stub. cubecl then fails with a bare
/// `RecvError` on its device thread, although a real driver may be installed.
pub fn cuda_stub_warnings(ld_library_path: &str, libraries: &[LibrarySearch]) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = libcuda_on_library_path(ld_library_path).filter(|p| is_stub(p)) {
        out.push(format!(
            "the dynamic loader would take {}, a CUDA toolkit stub (its directory is on \
             LD_LIBRARY_PATH): CUDA then fails with a bare RecvError; remove the stubs/ \
             directory from LD_LIBRARY_PATH",
            p.display()
        ));
    }
    for lib in libraries.iter().filter(|l| l.library == "libcuda") {
        if let Some(f) = lib
            .found
            .as_deref()
            .filter(|f| is_stub(std::path::Path::new(f)))
        {
            out.push(format!(
                "the only libcuda found is {f}, a CUDA toolkit stub, not the driver: install \
                 the NVIDIA driver (or mount it into the container)"
            ));
        }
    }
    out
}

/// Gather the report.
pub fn report() -> DoctorReport {
    let (cpu_model, physical_cores) = cpuinfo();
    let mut features = Vec::new();
    if cfg!(feature = "cuda") {
        features.push("cuda".to_string());
    }
    if cfg!(feature = "no-spans") {
        features.push("no-spans".to_string());
    }
    let mut backends = vec!["flex".to_string(), "ndarray".to_string()];
    if cfg!(feature = "cuda") {
        backends.push("cuda (f32, bf16)".to_string());
    }
    let thread_env = [
        "RAYON_NUM_THREADS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "KILN_LOG",
    ]
    .iter()
    .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}")))
    .collect();
    let os = format!(
        "{} {}",
        std::env::consts::OS,
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    );
    DoctorReport {
        kiln_version: env!("CARGO_PKG_VERSION").into(),
        burn_version: crate::BURN_VERSION.into(),
        rustc: crate::RUSTC_VERSION.into(),
        target: kiln_model::TARGET.into(),
        build_profile: kiln_model::BUILD_PROFILE.into(),
        features,
        backends,
        default_device: "cpu (flex)".into(),
        cpu_model,
        logical_cores: crate::observe::resources::cores(),
        physical_cores,
        rayon_threads: rayon::current_num_threads(),
        thread_env,
        os: os.trim().to_string(),
        memory_total_mb: memory_total_mb(),
        cuda: cuda_report(),
    }
}

impl DoctorReport {
    /// Human-readable text.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let mut kv = |k: &str, v: String| s.push_str(&format!("{k:<16} {v}\n"));
        kv("kiln", self.kiln_version.clone());
        kv("burn", self.burn_version.clone());
        kv("rustc", self.rustc.clone());
        kv(
            "target",
            format!("{} ({})", self.target, self.build_profile),
        );
        kv(
            "features",
            if self.features.is_empty() {
                "(none)".into()
            } else {
                self.features.join(", ")
            },
        );
        kv("backends", self.backends.join(", "));
        kv("default device", self.default_device.clone());
        kv("cpu", self.cpu_model.clone());
        kv(
            "cores",
            format!(
                "{} logical{}",
                self.logical_cores,
                self.physical_cores
                    .map(|p| format!(", {p} physical"))
                    .unwrap_or_default()
            ),
        );
        kv("rayon threads", self.rayon_threads.to_string());
        kv(
            "thread env",
            if self.thread_env.is_empty() {
                "(none set)".into()
            } else {
                self.thread_env.join(" ")
            },
        );
        kv("os", self.os.clone());
        kv(
            "memory",
            self.memory_total_mb
                .map(|m| format!("{m} MiB"))
                .unwrap_or_else(|| "unknown".into()),
        );
        match &self.cuda {
            None => kv("cuda", "not built (rebuild with --features cuda)".into()),
            Some(c) => {
                kv(
                    "cuda",
                    if c.available {
                        "available".into()
                    } else {
                        format!("unavailable: {}", c.error.clone().unwrap_or_default())
                    },
                );
                kv(
                    "driver",
                    c.driver_version.clone().unwrap_or_else(|| "unknown".into()),
                );
                kv(
                    "cuda version",
                    c.cuda_version.clone().unwrap_or_else(|| "unknown".into()),
                );
                kv(
                    "gpus",
                    if c.gpus.is_empty() {
                        "(none)".into()
                    } else {
                        c.gpus.join("; ")
                    },
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toolkit's `stubs/libcuda.so.1` first on `LD_LIBRARY_PATH` is named as what the loader
    /// would take; a real one is not warned about.
    #[test]
    fn a_stub_libcuda_on_the_library_path_is_warned_about() {
        let tmp = tempfile::tempdir().unwrap();
        let stubs = tmp.path().join("cuda/lib64/stubs");
        let real = tmp.path().join("nvidia/lib64");
        for d in [&stubs, &real] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("libcuda.so.1"), b"").unwrap();
        }
        let path = format!("/nonexistent:{}:{}", stubs.display(), real.display());
        assert_eq!(
            super::libcuda_on_library_path(&path),
            Some(stubs.join("libcuda.so.1"))
        );
        let w = super::cuda_stub_warnings(&path, &[]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("stub") && w[0].contains("LD_LIBRARY_PATH"),
            "{w:?}"
        );
        let path = format!("{}:{}", real.display(), stubs.display());
        assert!(super::cuda_stub_warnings(&path, &[]).is_empty());
        let found_stub = super::LibrarySearch {
            library: "libcuda".into(),
            names: vec!["libcuda.so.1".into()],
            dirs: Vec::new(),
            found: Some(stubs.join("libcuda.so.1").display().to_string()),
            loadable: None,
        };
        assert_eq!(super::cuda_stub_warnings("", &[found_stub]).len(), 1);
    }

    #[test]
    fn json_has_every_field() {
        let r = report();
        let v = serde_json::to_value(&r).unwrap();
        for k in [
            "kiln_version",
            "burn_version",
            "rustc",
            "target",
            "build_profile",
            "features",
            "backends",
            "default_device",
            "cpu_model",
            "logical_cores",
            "physical_cores",
            "rayon_threads",
            "thread_env",
            "os",
            "memory_total_mb",
            "cuda",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(r.burn_version, "0.21.0");
        assert!(r.rustc.starts_with("rustc "));
        assert!(r.logical_cores >= 1);
        assert!(r.text().contains("burn             0.21.0"));
    }
}
