//! Compiles every `cuda/*.cu` into a fatbin with nvcc and generates `$OUT_DIR/kernels.rs`
//! (`FATBINS`, `BUILT`, `WHY`, `INFO`), which `src/cuda/fatbin.rs` includes.
//!
//! nvcc is looked for in this order: `$STRATA_NVCC`; `nvcc` on `PATH`; `$CUDA_HOME/bin/nvcc`;
//! the PyPI toolkit (`site-packages/nvidia/cu13/bin/nvcc` of `$PYTHON`, `$PYO3_PYTHON`,
//! `python3`). Not found: `BUILT = false` and `WHY` says why (the crate builds; no GPU at run
//! time), unless `STRATA_REQUIRE_KERNELS=1`, which makes that a build error. A file nvcc
//! rejects is always a build error with nvcc's output. `STRATA_SKIP_KERNELS=1` builds without
//! kernels on purpose (builds that never touch the GPU, e.g. the fuzzer).
//!
//! Archs: `$STRATA_CUDA_ARCHS` (comma list, default `80,86,89,90,120`) as SASS plus
//! `compute_90` PTX. Each file's fatbin is cached in `<target dir>/strata-cuda/` under a hash
//! of its source, every header, nvcc's path and version and the flags, so editing one `.cu`
//! recompiles only that file (a header change recompiles all), and the profiles and feature
//! sets of one target dir share the fatbins.

use std::collections::hash_map::DefaultHasher;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "80,86,89,90,120";
const ENV_VARS: &[&str] = &[
    "STRATA_NVCC",
    "STRATA_CUDA_ARCHS",
    "STRATA_REQUIRE_KERNELS",
    "STRATA_SKIP_KERNELS",
    "CUDA_HOME",
    "PYTHON",
    "PYO3_PYTHON",
];

fn main() {
    for v in ENV_VARS {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let cuda_dir = manifest.join("..").join("cuda");
    println!("cargo:rerun-if-changed={}", cuda_dir.display());
    let require = env::var("STRATA_REQUIRE_KERNELS").is_ok_and(|v| v == "1");

    let generated = match build(&cuda_dir, &out_dir) {
        Ok(g) => g,
        Err(why) => {
            if require {
                panic!("STRATA_REQUIRE_KERNELS=1 but the CUDA kernels cannot be built: {why}");
            }
            println!("cargo:warning=strata: CUDA kernels not built ({why}); the GPU path is off");
            not_built(&why)
        }
    };
    fs::write(out_dir.join("kernels.rs"), generated).expect("write kernels.rs");
}

/// `Err(why)` when nvcc or the sources are missing; panics when nvcc rejects a file.
fn build(cuda_dir: &Path, out_dir: &Path) -> Result<String, String> {
    if !cuda_dir.is_dir() {
        return Err(format!("no kernel folder {}", cuda_dir.display()));
    }
    if env::var("STRATA_SKIP_KERNELS").is_ok_and(|v| v == "1") {
        return Err("STRATA_SKIP_KERNELS=1".into());
    }
    let nvcc = find_nvcc()?;
    println!("cargo:rerun-if-changed={}", nvcc.display());
    let archs = parse_archs(&env::var("STRATA_CUDA_ARCHS").unwrap_or(DEFAULT_ARCHS.into()))?;
    let version = nvcc_version(&nvcc)?;

    let mut sources = Vec::new();
    let mut headers = Vec::new();
    for entry in fs::read_dir(cuda_dir).map_err(|e| format!("{}: {e}", cuda_dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("cu") => sources.push(path),
            Some("cuh") => headers.push(path),
            _ => {}
        }
    }
    sources.sort();
    headers.sort();
    for p in sources.iter().chain(&headers) {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let mut flags: Vec<String> = ["-fatbin", "-O3", "-std=c++17", "-lineinfo"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    flags.push(format!("-I{}", cuda_dir.display()));
    for a in &archs {
        flags.push(format!("-gencode=arch=compute_{a},code=sm_{a}"));
    }
    flags.push("-gencode=arch=compute_90,code=compute_90".into());

    // Hash of everything but the file itself that decides a fatbin's bytes.
    let mut common = DefaultHasher::new();
    nvcc.hash(&mut common);
    version.hash(&mut common);
    flags.hash(&mut common);
    for h in &headers {
        fs::read(h)
            .map_err(|e| format!("{}: {e}", h.display()))?
            .hash(&mut common);
    }
    let common = common.finish();

    let jobs = env::var("NUM_JOBS")
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or(2)
        .clamp(1, 16);
    // Files run in parallel; within a file nvcc builds the targets on the cores left over
    // (not hashed: the output does not depend on it).
    let threads = (jobs / jobs.min(sources.len().max(1))).max(1);
    let results: Vec<(&PathBuf, Result<PathBuf, String>)> = std::thread::scope(|scope| {
        let chunks: Vec<Vec<&PathBuf>> = (0..jobs)
            .map(|j| sources.iter().skip(j).step_by(jobs).collect())
            .collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let (nvcc, flags) = (&nvcc, &flags);
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|src| (src, compile(nvcc, flags, threads, common, src, out_dir)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("nvcc worker panicked"))
            .collect()
    });

    let mut fatbins = Vec::new();
    for (src, r) in results {
        match r {
            Ok(p) => fatbins.push((stem(src), p)),
            Err(msg) => panic!("nvcc failed on {}:\n{msg}", src.display()),
        }
    }
    // The workers took the files round-robin; restore the sorted order.
    fatbins.sort();
    let info = format!(
        "{version}; sm_{} + compute_90 PTX; {} file(s)",
        archs.join(",sm_"),
        fatbins.len()
    );
    Ok(generate(&fatbins, &info))
}

fn stem(p: &Path) -> String {
    p.file_stem()
        .and_then(|s| s.to_str())
        .expect("utf-8 file name")
        .to_string()
}

/// Compiles `src` unless a fatbin with the same key is already in `out_dir`.
fn compile(
    nvcc: &Path,
    flags: &[String],
    threads: usize,
    common: u64,
    src: &Path,
    out_dir: &Path,
) -> Result<PathBuf, String> {
    let name = stem(src);
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "kernel file names must be [A-Za-z0-9_]+.cu, not {name:?}"
        ));
    }
    let text = fs::read(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut h = DefaultHasher::new();
    common.hash(&mut h);
    text.hash(&mut h);
    let key = format!("{:016x}", h.finish());
    let out = out_dir.join(format!("{name}.fatbin"));
    // Fatbins are shared, by key, between the build's profiles and feature sets (cargo test,
    // clippy and maturin each have their own OUT_DIR) in <target dir>/strata-cuda/.
    let cache_dir = cache_dir(out_dir);
    let cached = cache_dir.join(format!("{name}-{key}.fatbin"));
    if !cached.is_file() {
        let tmp = cache_dir.join(format!("{name}-{key}.{}.tmp", std::process::id()));
        let output = Command::new(nvcc)
            .args(flags)
            .arg("-t")
            .arg(threads.to_string())
            .arg("-o")
            .arg(&tmp)
            .arg(src)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
        if !output.status.success() {
            let _ = fs::remove_file(&tmp);
            return Err(format!(
                "{} {} -o {} {}\n{}{}",
                nvcc.display(),
                flags.join(" "),
                out.display(),
                src.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        // Atomic: a parallel build of another profile sees the whole file or none.
        fs::rename(&tmp, &cached).map_err(|e| format!("{}: {e}", cached.display()))?;
    }
    fs::copy(&cached, &out).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out)
}

/// `<target dir>/strata-cuda` (OUT_DIR is `<target>/<profile>/build/<pkg>/out`), else OUT_DIR.
fn cache_dir(out_dir: &Path) -> PathBuf {
    let dir = out_dir
        .ancestors()
        .nth(4)
        .map(|t| t.join("strata-cuda"))
        .unwrap_or_else(|| out_dir.to_path_buf());
    if fs::create_dir_all(&dir).is_ok() {
        dir
    } else {
        out_dir.to_path_buf()
    }
}

fn parse_archs(s: &str) -> Result<Vec<String>, String> {
    let archs: Vec<String> = s
        .split(',')
        .map(|a| a.trim().trim_start_matches("sm_").to_string())
        .filter(|a| !a.is_empty())
        .collect();
    if archs.is_empty()
        || archs
            .iter()
            .any(|a| !a.chars().all(|c| c.is_ascii_alphanumeric()))
    {
        panic!("STRATA_CUDA_ARCHS={s:?}: expected a comma list such as 80,86,89,90,120");
    }
    Ok(archs)
}

fn nvcc_version(nvcc: &Path) -> Result<String, String> {
    let out = Command::new(nvcc)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} --version failed: {}",
            nvcc.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let release = text
        .lines()
        .find_map(|l| l.split("release ").nth(1))
        .map(|r| format!("nvcc {}", r.trim()))
        .unwrap_or_else(|| "nvcc (unknown version)".into());
    Ok(format!("{release} ({})", nvcc.display()))
}

/// `$STRATA_NVCC`, `PATH`, `$CUDA_HOME/bin`, then the PyPI toolkit of the build's Python.
fn find_nvcc() -> Result<PathBuf, String> {
    if let Ok(p) = env::var("STRATA_NVCC") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("STRATA_NVCC={} is not a file", p.display()))
        };
    }
    let mut looked = Vec::new();
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let p = dir.join("nvcc");
            if p.is_file() {
                return Ok(p);
            }
        }
        looked.push("PATH".to_string());
    }
    if let Ok(home) = env::var("CUDA_HOME") {
        let p = Path::new(&home).join("bin").join("nvcc");
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p.display().to_string());
    }
    let mut pythons: Vec<String> = ["PYTHON", "PYO3_PYTHON"]
        .iter()
        .filter_map(|v| env::var(v).ok())
        .collect();
    pythons.push("python3".into());
    for py in pythons {
        for dir in python_paths(&py) {
            for rel in ["nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"] {
                let p = dir.join(rel);
                if p.is_file() {
                    return Ok(p);
                }
            }
        }
        looked.push(format!("site-packages of {py}"));
    }
    Err(format!(
        "nvcc not found (looked in {}); install it with \
         `pip install \"cuda-toolkit[nvcc,cudart,cccl]==13.0.3.0\"` or set STRATA_NVCC",
        looked.join(", ")
    ))
}

/// The import path and site-packages folders of a Python interpreter (empty if it won't run).
fn python_paths(python: &str) -> Vec<PathBuf> {
    let code = "import site, sys, sysconfig\n\
                p = list(sys.path) + list(sysconfig.get_paths().values())\n\
                p += site.getsitepackages() if hasattr(site, 'getsitepackages') else []\n\
                print('\\n'.join(x for x in p if x))";
    match Command::new(python).arg("-c").arg(code).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

fn generate(fatbins: &[(String, PathBuf)], info: &str) -> String {
    let mut s = String::from(
        "// Generated by rust/build.rs; do not edit.\n\
         // Fatbins are 16-byte aligned: the driver parses their headers in place.\n\
         #[repr(C, align(16))]\nstruct Aligned<T: ?Sized>(T);\n",
    );
    for (i, (_, path)) in fatbins.iter().enumerate() {
        let n = fs::metadata(path).expect("fatbin written").len();
        writeln!(
            s,
            "static F{i}: &Aligned<[u8; {n}]> = &Aligned(*include_bytes!({:?}));",
            path.display().to_string()
        )
        .unwrap();
    }
    s.push_str("/// (file stem, fatbin bytes) for every `cuda/*.cu`.\n");
    s.push_str("pub static FATBINS: &[(&str, &[u8])] = &[\n");
    for (i, (name, _)) in fatbins.iter().enumerate() {
        writeln!(s, "    ({name:?}, &F{i}.0),").unwrap();
    }
    s.push_str(
        "];\n/// Whether nvcc built the kernels into this binary.\npub const BUILT: bool = true;\n",
    );
    s.push_str(
        "/// Why the kernels are missing (empty when `BUILT`).\npub const WHY: &str = \"\";\n",
    );
    writeln!(
        s,
        "/// The compiler and targets.\npub const INFO: &str = {info:?};"
    )
    .unwrap();
    s
}

fn not_built(why: &str) -> String {
    format!(
        "// Generated by rust/build.rs; do not edit.\n\
         /// (file stem, fatbin bytes) for every `cuda/*.cu`.\n\
         pub static FATBINS: &[(&str, &[u8])] = &[];\n\
         /// Whether nvcc built the kernels into this binary.\n\
         pub const BUILT: bool = false;\n\
         /// Why the kernels are missing (empty when `BUILT`).\n\
         pub const WHY: &str = {why:?};\n\
         /// The compiler and targets.\n\
         pub const INFO: &str = \"\";\n"
    )
}
