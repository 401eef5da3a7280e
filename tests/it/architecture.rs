//! The layering rules Cargo cannot see, checked mechanically:
//!
//! 1. **Between crates**: Cargo refuses a dependency cycle, but not a dependency that points
//!    sideways or up (`kiln-track` taking `kiln-serve`, say). [`CRATE_LEVEL`] gives each member
//!    crate its level; a crate may depend only on member crates of a lower level, and the
//!    serving crates never on the trainer (`kiln-core`).
//! 2. **Inside the layered crates** (`kiln-core`, `kiln-model`, `kiln-serve`: one crate each,
//!    so Cargo sees nothing): no import cycle among their files (a parent module declaring or
//!    re-exporting its children is not an import; a child reaching up to its parent or
//!    siblings is), and no top-level module importing a module of a higher level (see the
//!    tables in each crate's `lib.rs`).
//! 3. **Inside every other member crate**: no import cycle among its files.
//!
//! A small parser of `crate::`, `super::` and `self::` paths rather than an external tool:
//! `cargo-modules` would add a rust-analyzer-sized build to every CI run for the same answer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A layered crate's level of a top-level module.
type Level = fn(&str) -> Option<u8>;

/// Level of each top-level module of `kiln-core`; a module may import modules of its own
/// level or lower. The model side (`artifact`, `backend`, `infer`, `model`) and `observe` are
/// other crates, re-exported: Cargo keeps them below.
fn core_level(top: &str) -> Option<u8> {
    Some(match top {
        "records" => 0,
        "config" => 1,
        "data" | "doctor" => 2,
        "train" => 3,
        "predict" | "bench" | "pick" | "export" | "import" => 4,
        "run" => 5,
        "" => 6, // lib.rs
        _ => return None,
    })
}

/// Level of each top-level module of `kiln-model`.
fn model_level(top: &str) -> Option<u8> {
    Some(match top {
        "records" | "stats" | "backend" | "dates" => 0,
        "preprocess" | "drift" | "model" => 1,
        "artifact" => 2,
        "infer" | "predict" => 3,
        "latency" => 4,
        "" => 5, // lib.rs
        _ => return None,
    })
}

/// Level of each top-level module of `kiln-serve` (the table in its `lib.rs`): the wire
/// format, kiln's records and the watches at the bottom; then the model, the metrics, the
/// queue, the batcher, the repository; the transport-neutral service; the transports; the
/// server.
fn serve_level(top: &str) -> Option<u8> {
    Some(match top {
        "error" | "protocol" | "records" | "corked" | "live_profile" | "monitor" | "otel" => 0,
        "model" => 1,
        "metrics" => 2,
        "queue" => 3,
        "batcher" => 4,
        "repository" => 5,
        "service" => 6,
        "conn" | "http" | "grpc" => 7,
        "server" => 8,
        "" => 9, // lib.rs
        _ => return None,
    })
}

/// The source directory of a member crate.
fn src(krate: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("crates")
        .join(krate)
        .join("src")
}

/// Level of each member crate (and of the root package, `kiln`): a crate may depend only on
/// member crates of a lower level.
const CRATE_LEVEL: [(&str, u8); 9] = [
    ("kiln-base", 0),
    ("kiln-mvn", 1),
    ("kiln-observe", 1),
    ("kiln-model", 2),
    ("kiln-core", 3),
    ("kiln-track", 4),
    ("kiln-serve", 4),
    ("kiln-loadgen", 5),
    ("kiln", 6),
];

/// `(package name, the kiln-* crates among its dependencies of every kind)` for the root
/// package and each member under `crates/`, read from their manifests.
fn member_manifests() -> Vec<(String, Vec<String>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut manifests = vec![root.join("Cargo.toml")];
    for e in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let m = e.path().join("Cargo.toml");
        if m.is_file() {
            manifests.push(m);
        }
    }
    let mut out = Vec::new();
    for m in manifests {
        let text = std::fs::read_to_string(&m).unwrap();
        let mut name = None;
        let mut deps = Vec::new();
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                section = line.trim_matches(|c| c == '[' || c == ']').to_string();
                continue;
            }
            let key = line.split(['=', '.', ' ']).next().unwrap_or("");
            if section == "package" && key == "name" {
                name = line.split('"').nth(1).map(str::to_string);
            }
            if section.ends_with("dependencies")
                && !section.starts_with("workspace")
                && key.starts_with("kiln-")
            {
                deps.push(key.to_string());
            }
        }
        out.push((name.expect("package name"), deps));
    }
    out
}

#[test]
fn member_crates_depend_only_downwards() {
    let level = |n: &str| CRATE_LEVEL.iter().find(|(c, _)| *c == n).map(|(_, l)| *l);
    let members = member_manifests();
    assert!(members.len() >= CRATE_LEVEL.len(), "found {members:?}");
    let mut bad = Vec::new();
    for (name, deps) in &members {
        let Some(la) = level(name) else {
            bad.push(format!(
                "{name}: no level in CRATE_LEVEL (tests/it/architecture.rs)"
            ));
            continue;
        };
        for d in deps {
            match level(d) {
                Some(lb) if lb < la => {}
                Some(lb) => bad.push(format!("{name} (level {la}) → {d} (level {lb})")),
                None => bad.push(format!("{name} → {d}: no level in CRATE_LEVEL")),
            }
        }
    }
    assert!(
        bad.is_empty(),
        "dependencies that do not point down:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_manifest_reader_sees_member_dependencies() {
    let members = member_manifests();
    let deps = |n: &str| &members.iter().find(|(c, _)| c == n).unwrap().1;
    assert!(deps("kiln-core").contains(&"kiln-mvn".to_string()));
    assert!(deps("kiln-loadgen").contains(&"kiln-serve".to_string()));
    assert!(deps("kiln-base").is_empty());
}

/// The serving tier builds without the trainer: a training edit never rebuilds the server.
#[test]
fn the_serving_crates_do_not_depend_on_the_trainer() {
    let members = member_manifests();
    let deps = |n: &str| members.iter().find(|(c, _)| c == n).unwrap().1.clone();
    // The closure over member crates (every member's own kiln-* dependencies).
    for root in ["kiln-serve", "kiln-loadgen"] {
        let mut seen = BTreeSet::new();
        let mut todo = vec![root.to_string()];
        while let Some(c) = todo.pop() {
            for d in deps(&c) {
                if seen.insert(d.clone()) {
                    todo.push(d);
                }
            }
        }
        assert!(
            !seen.contains("kiln-core"),
            "{root} depends on kiln-core (through {seen:?})"
        );
        assert!(seen.contains("kiln-model"), "{root}: {seen:?}");
    }
}

/// Module path (`model::mvn::module`) → source without comments and test modules, for the
/// files under `src`.
fn library_files(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut mods = BTreeMap::new();
    for p in files {
        let rel = p.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|l| l == "mod") {
            parts.pop();
        }
        if parts == ["lib"] {
            parts.clear();
        }
        if parts.last().is_some_and(|l| l == "tests") {
            continue; // a test-only file
        }
        let text = std::fs::read_to_string(&p).unwrap();
        mods.insert(parts.join("::"), strip(&text));
    }
    mods
}

/// Drop `//` comments and everything from `#[cfg(test)] mod tests` on.
fn strip(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod tests"))
        {
            break;
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every path written as `crate::a::b`, `super::a`, `self::a`, or inside a `crate::{…}`
/// group, as (head, segments).
fn paths(code: &str) -> Vec<(String, Vec<String>)> {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    for head in ["crate", "super", "self"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(head) {
            let start = from + i;
            from = start + head.len();
            if start > 0 && (ident(bytes[start - 1]) || bytes[start - 1] == b'$') {
                continue;
            }
            let mut j = from;
            let mut segs: Vec<String> = Vec::new();
            while code[j..].starts_with("::") {
                j += 2;
                if code[j..].starts_with('{') {
                    // One level of grouping: `crate::{a, b::c}`.
                    let end = code[j..].find('}').map_or(code.len(), |e| j + e);
                    for item in code[j + 1..end].split(',') {
                        let mut s = segs.clone();
                        s.extend(
                            item.trim()
                                .split("::")
                                .map(|x| x.trim().to_string())
                                .filter(|x| !x.is_empty() && x != "self"),
                        );
                        out.push((head.to_string(), s));
                    }
                    segs.clear();
                    break;
                }
                let k = code[j..]
                    .bytes()
                    .position(|b| !ident(b))
                    .map_or(code.len(), |p| j + p);
                if k == j {
                    break;
                }
                segs.push(code[j..k].to_string());
                j = k;
            }
            if !segs.is_empty() {
                out.push((head.to_string(), segs));
            }
        }
    }
    out
}

/// File-level import edges (importer → imported file), parent → child edges excluded.
fn edges(mods: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let resolve = |mut segs: Vec<String>| -> Option<String> {
        while !segs.is_empty() {
            let k = segs.join("::");
            if mods.contains_key(&k) {
                return Some(k);
            }
            segs.pop();
        }
        None
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, code) in mods {
        let cur: Vec<String> = if m.is_empty() {
            Vec::new()
        } else {
            m.split("::").map(str::to_string).collect()
        };
        for (head, segs) in paths(code) {
            let mut base = match head.as_str() {
                "crate" => Vec::new(),
                "super" => cur[..cur.len().saturating_sub(1)].to_vec(),
                _ => cur.clone(),
            };
            base.extend(segs);
            let Some(t) = resolve(base) else { continue };
            let is_child = m.is_empty() || t.starts_with(&format!("{m}::"));
            if &t != m && !is_child {
                out.entry(m.clone()).or_default().insert(t);
            }
        }
    }
    out
}

fn top(m: &str) -> &str {
    m.split("::").next().unwrap_or("")
}

/// The first import cycle among `mods`' files, if any.
fn find_cycle(mods: &BTreeMap<String, String>) -> Option<Vec<String>> {
    let g = edges(mods);
    // Depth-first search for a back edge; report the cycle it closes.
    fn visit(
        v: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(v.to_string(), 1);
        stack.push(v.to_string());
        for w in g.get(v).into_iter().flatten() {
            match state.get(w.as_str()) {
                Some(1) => {
                    let i = stack.iter().position(|s| s == w).unwrap();
                    let mut c = stack[i..].to_vec();
                    c.push(w.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(w, g, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(v.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in mods.keys() {
        if !state.contains_key(m.as_str())
            && let Some(c) = visit(m, &g, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

/// The member crates whose files must import without cycles.
const ACYCLIC_CRATES: [&str; 8] = [
    "base", "mvn", "observe", "model", "core", "track", "serve", "loadgen",
];

#[test]
fn no_import_cycles_among_library_files() {
    let mut bad = Vec::new();
    for krate in ACYCLIC_CRATES {
        let mods = library_files(&src(krate));
        assert!(mods.len() > 3, "{krate}: found only {} files", mods.len());
        if let Some(c) = find_cycle(&mods) {
            bad.push(format!("{krate}: {}", c.join(" → ")));
        }
    }
    assert!(bad.is_empty(), "import cycles:\n{}", bad.join("\n"));
}

#[test]
fn top_level_modules_import_only_downwards() {
    let mut bad = Vec::new();
    let layered: [(&str, Level); 3] = [
        ("core", core_level),
        ("model", model_level),
        ("serve", serve_level),
    ];
    for (krate, level) in layered {
        let mods = library_files(&src(krate));
        for (from, tos) in edges(&mods) {
            let (a, la) = (top(&from), level(top(&from)));
            let Some(la) = la else {
                bad.push(format!(
                    "{krate}: {from}: module `{a}` has no level in tests/it/architecture.rs"
                ));
                continue;
            };
            for to in tos {
                let b = top(&to);
                if a == b || b.is_empty() {
                    continue;
                }
                match level(b) {
                    Some(lb) if lb <= la => {}
                    Some(lb) => {
                        bad.push(format!("{krate}: {from} (level {la}) → {to} (level {lb})"))
                    }
                    None => bad.push(format!("{krate}: {to}: module `{b}` has no level")),
                }
            }
        }
    }
    assert!(bad.is_empty(), "upward imports:\n{}", bad.join("\n"));
}

#[test]
fn the_parser_sees_grouped_and_relative_paths() {
    let p = paths("use crate::{config::X, data};\nuse super::a::B;\nfn f() { $crate::y(); }");
    let flat: Vec<String> = p
        .iter()
        .map(|(h, s)| format!("{h}::{}", s.join("::")))
        .collect();
    assert!(flat.contains(&"crate::config::X".to_string()), "{flat:?}");
    assert!(flat.contains(&"crate::data".to_string()), "{flat:?}");
    assert!(flat.contains(&"super::a::B".to_string()), "{flat:?}");
    assert!(!flat.iter().any(|f| f.contains('y')), "{flat:?}");
    assert_eq!(
        strip("a // crate::x\n#[cfg(test)]\nmod tests {\n use crate::z;\n}\n"),
        "a \n"
    );
}
