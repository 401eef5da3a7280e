//! The deployment files under `deploy/` checked against the CLI and the server they drive:
//! every `kiln …` command line in a Kubernetes object names real subcommands and flags (read
//! from `kiln … --help`), ports agree between flags, containers, probes and the Service,
//! the probe paths answer on a running `kiln serve`, the termination grace covers the drain,
//! the volumes line up (the promoter writes where the servers read), and the Dockerfile
//! builds with the lock file and runs unprivileged. With `KILN_TEST_KUBERNETES_VALIDATE` set
//! (`.ci/kubernetes.sh` sets it) the core objects are also validated against the Kubernetes
//! schemas offline; that test is `#[ignore]`d and needs the variable.

use crate::common::root;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

fn k8s(file: &str) -> Value {
    let path = root().join("deploy/kubernetes").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn help(chain: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(chain)
        .arg("--help")
        .output()
        .unwrap();
    assert!(o.status.success(), "kiln {chain:?} --help failed");
    String::from_utf8(o.stdout).unwrap()
}

/// The subcommand names of a clap help text.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Whether `text` mentions `flag` as a whole word.
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(i, _)| {
        let next = text[i + flag.len()..].chars().next();
        next.is_none_or(|c| !(c.is_alphanumeric() || c == '-' || c == '_'))
    })
}

/// Shell-like words (quotes removed), enough for the scripts in the manifests.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (_, c) => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// Every `kiln …` argument list of a container: its args when kiln is the entrypoint, or
/// each `kiln` invocation in a `/bin/sh -c` script.
fn invocations(container: &Value) -> Vec<Vec<String>> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let command = strings(&container["command"]);
    let args = strings(&container["args"]);
    if command.is_empty() {
        return vec![args];
    }
    assert_eq!(command, ["/bin/sh", "-c"], "unexpected command {command:?}");
    let mut out = Vec::new();
    for line in args.join("\n").lines() {
        let w = words(line);
        let mut i = 0;
        while i < w.len() {
            // `kiln …`, `exec kiln …` or `x=$(kiln …)`.
            if w[i] == "kiln" || w[i].ends_with("$(kiln") {
                let mut inv = Vec::new();
                for t in &w[i + 1..] {
                    i += 1;
                    match t.strip_suffix(')') {
                        Some(t) => {
                            inv.push(t.to_string());
                            break;
                        }
                        None => inv.push(t.clone()),
                    }
                }
                out.push(inv);
            }
            i += 1;
        }
    }
    assert!(!out.is_empty(), "no kiln command in {args:?}");
    out
}

/// Check one invocation against `kiln … --help`; false when it uses a pending subcommand.
fn check_invocation(inv: &[String], file: &str) -> bool {
    let top = help(&[]);
    let sub = inv[0].as_str();
    assert!(
        subcommands(&top).iter().any(|s| s == sub),
        "{file}: `kiln {sub}` is not a subcommand"
    );
    let mut chain = vec![sub];
    let sub_help = help(&chain);
    if let Some(next) = inv.get(1).filter(|n| !n.starts_with('-')) {
        let nested = subcommands(&sub_help);
        if nested.iter().any(|s| s == next) {
            chain.push(next);
        }
    }
    let h = help(&chain);
    for t in inv.iter().filter(|t| t.starts_with("--")) {
        let flag = t.split('=').next().unwrap();
        assert!(
            mentions(&h, flag),
            "{file}: `kiln {}` has no flag {flag}",
            chain.join(" ")
        );
    }
    true
}

/// The value after `flag` in an argument list.
fn flag_value<'a>(inv: &'a [String], flag: &str) -> Option<&'a str> {
    inv.iter()
        .position(|t| t == flag)
        .and_then(|i| inv.get(i + 1))
        .map(String::as_str)
}

/// The pod template's spec of a workload object.
fn pod_spec(obj: &Value) -> &Value {
    match obj["kind"].as_str().unwrap() {
        "CronJob" => &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        "Deployment" | "Job" => &obj["spec"]["template"]["spec"],
        "InferenceService" => &obj["spec"]["predictor"],
        k => panic!("no pod spec in a {k}"),
    }
}

fn container(obj: &Value) -> &Value {
    let c = pod_spec(obj)["containers"].as_array().unwrap();
    assert_eq!(c.len(), 1);
    &c[0]
}

/// Mount path of the volume backed by `claim` in a pod spec.
fn mount_of_claim(spec: &Value, claim: &str) -> Option<String> {
    let vol = spec["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["persistentVolumeClaim"]["claimName"] == claim)?;
    spec["containers"][0]["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == vol["name"])
        .map(|m| m["mountPath"].as_str().unwrap().to_string())
}

const FILES: &[&str] = &[
    "model-repository-pvc.yaml",
    "retrain-cronjob.yaml",
    "sweep-job.yaml",
    "serve-deployment.yaml",
    "serve-service.yaml",
    "serve-hpa.yaml",
    "kserve-inferenceservice.yaml",
];

#[test]
fn every_kiln_command_line_exists_in_the_cli() {
    let listed: Vec<String> = std::fs::read_dir(root().join("deploy/kubernetes"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for f in &listed {
        assert!(
            FILES.contains(&f.as_str()),
            "{f} is not checked by this test"
        );
    }
    let mut checked = 0;
    for f in FILES {
        let obj = k8s(f);
        if matches!(
            obj["kind"].as_str(),
            Some("PersistentVolumeClaim" | "Service" | "HorizontalPodAutoscaler")
        ) {
            continue;
        }
        for inv in invocations(container(&obj)) {
            if check_invocation(&inv, f) {
                checked += 1;
            }
        }
    }
    // serve ×2, train, promote (+ sweep run once it exists).
    assert!(checked >= 4, "only {checked} command lines checked");
}

#[test]
fn retraining_promotes_into_the_repository_the_servers_read() {
    let pvc = k8s("model-repository-pvc.yaml");
    let claim = pvc["metadata"]["name"].as_str().unwrap();
    assert!(
        pvc["spec"]["accessModes"]
            .as_array()
            .unwrap()
            .contains(&Value::from("ReadWriteMany")),
        "one writer pod and many reader pods need ReadWriteMany"
    );
    let cron = k8s("retrain-cronjob.yaml");
    let invs = invocations(container(&cron));
    assert_eq!(invs.len(), 2);
    assert_eq!(invs[0][0], "train");
    assert_eq!(invs[1][0], "promote");
    let written = flag_value(&invs[1], "--repository").unwrap();
    assert_eq!(
        mount_of_claim(pod_spec(&cron), claim).as_deref(),
        Some(written)
    );
    // A refusal (3) or bad input (2) fails the Job without retraining again.
    let rules = &cron["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"][0];
    assert_eq!(rules["action"], "FailJob");
    assert_eq!(rules["onExitCodes"]["values"], serde_json::json!([2, 3]));
    assert_eq!(
        rules["onExitCodes"]["containerName"],
        container(&cron)["name"]
    );
    let deploy = k8s("serve-deployment.yaml");
    let serve = &invocations(container(&deploy))[0];
    assert_eq!(
        mount_of_claim(pod_spec(&deploy), claim).as_deref(),
        flag_value(serve, "--repository")
    );
    let kserve = k8s("kserve-inferenceservice.yaml");
    let c = container(&kserve);
    assert_eq!(c["name"], "kserve-container");
    let env: BTreeMap<&str, &str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        // Plain values only (the control token comes from a Secret).
        .filter_map(|e| Some((e["name"].as_str().unwrap(), e["value"].as_str()?)))
        .collect();
    assert_eq!(env["STORAGE_URI"], format!("pvc://{claim}"));
    // KServe mounts the storage at /mnt/models.
    assert_eq!(
        flag_value(&invocations(c)[0], "--repository"),
        Some("/mnt/models")
    );
}

#[test]
fn the_sweep_is_an_indexed_job_over_every_configuration() {
    let job = k8s("sweep-job.yaml");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    assert!(spec["backoffLimitPerIndex"].as_u64().unwrap() >= 1);
    assert_eq!(pod_spec(&job)["restartPolicy"], "Never");
    let inv = &invocations(container(&job))[0];
    assert_eq!(&inv[..2], ["sweep", "run"]);
    assert_eq!(flag_value(inv, "--index"), Some("$JOB_COMPLETION_INDEX"));
    assert!(flag_value(inv, "--registry").is_some());
    // completions = the number of runs the sweep file expands to (the grid's product).
    let sweep_file = root().join(&inv[2]);
    let sweep: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&sweep_file).unwrap()).unwrap();
    let runs: usize = sweep["grid"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_array().unwrap().len())
        .product();
    assert_eq!(spec["completions"].as_u64().unwrap() as usize, runs);
}

#[test]
fn ports_probes_and_the_drain_agree_with_the_server() {
    let deploy = k8s("serve-deployment.yaml");
    let c = container(&deploy);
    let serve = &invocations(c)[0];
    let port: u64 = flag_value(serve, "--port").unwrap().parse().unwrap();
    let cport = &c["ports"][0];
    assert_eq!(cport["containerPort"].as_u64(), Some(port));
    assert_eq!(flag_value(serve, "--host"), Some("0.0.0.0"));
    // The KServe v2 gRPC endpoint is exposed on the port the server is told to use.
    let grpc: u64 = flag_value(serve, "--grpc-port").unwrap().parse().unwrap();
    let gport = &c["ports"][1];
    assert_eq!(
        (gport["name"].as_str(), gport["containerPort"].as_u64()),
        (Some("grpc"), Some(grpc))
    );
    let name = cport["name"].as_str().unwrap();
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/v2/health/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/v2/health/live");
    for p in ["readinessProbe", "livenessProbe"] {
        assert_eq!(c[p]["httpGet"]["port"], name);
    }
    // The Service selects the Deployment's pods and targets its port.
    let svc = k8s("serve-service.yaml");
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "selector {k}");
    }
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], name);
    assert_eq!(svc["spec"]["ports"][1]["targetPort"], "grpc");
    let hpa = k8s("serve-hpa.yaml");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deploy["metadata"]["name"]
    );
    assert!(
        c["resources"]["requests"]["cpu"].is_string(),
        "HPA on CPU needs a request"
    );
    // Grace > preStop + the longest request the drain waits for.
    let pre_stop: u64 = c["lifecycle"]["preStop"]["exec"]["command"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let request_ms: u64 = flag_value(serve, "--request-timeout-ms")
        .unwrap()
        .parse()
        .unwrap();
    let grace = pod_spec(&deploy)["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert!(
        grace > pre_stop + request_ms.div_ceil(1000),
        "grace {grace} s < preStop {pre_stop} s + request timeout {request_ms} ms"
    );
    let kserve = k8s("kserve-inferenceservice.yaml");
    let k = container(&kserve);
    let kport: u64 = flag_value(&invocations(k)[0], "--port")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(k["ports"][0]["containerPort"].as_u64(), Some(kport));
    assert_eq!(kport, 8080, "KServe routes to 8080");
    // The probe paths answer on a real server (an empty repository is ready).
    let repo = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", "0", "--grpc-port", "0", "--repository"])
        .arg(repo.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let rx = crate::common::printed_addrs(stderr);
    let addr = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let mut client = kiln::loadgen::client::BlockingClient::new(addr)
        .unwrap()
        .with_timeout(Duration::from_secs(10));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for p in ["readinessProbe", "livenessProbe"] {
        let path = c[p]["httpGet"]["path"].as_str().unwrap();
        loop {
            let status = client.get(path).map(|r| r.status).unwrap_or(0);
            assert_ne!(status, 404, "{path} is not a route of kiln serve");
            if status == 200 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{path}: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn the_dockerfile_builds_locked_and_runs_unprivileged() {
    let text = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let froms = lines.iter().filter(|l| l.starts_with("FROM ")).count();
    assert!(froms >= 2, "multi-stage: {froms} FROM lines");
    assert!(text.contains("cargo build --release --locked"));
    let user = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER line");
    assert!(
        !user.starts_with("root") && !user.starts_with("0"),
        "runs as {user}"
    );
    assert!(lines.contains(&r#"ENTRYPOINT ["kiln"]"#));
    // What the build reads is copied in (sources, lock file, the member crates with their
    // build scripts and the gRPC proto, embedded assets).
    assert!(root().join("crates/model/build.rs").is_file());
    assert!(
        root()
            .join("crates/serve/proto/grpc_predict_v2.proto")
            .is_file()
    );
    for needed in ["Cargo.toml", "Cargo.lock", "src", "crates", "assets"] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("COPY ") && l.split_whitespace().any(|w| w == needed)),
            "the build stage does not copy {needed}"
        );
    }
    // The exposed port is `kiln serve`'s default.
    let serve_help = help(&["serve"]);
    let default_port = serve_help
        .split("--port <PORT>")
        .nth(1)
        .and_then(|s| s.split("[default: ").nth(1))
        .and_then(|s| s.split(']').next())
        .unwrap();
    assert!(lines.contains(&format!("EXPOSE {default_port}").as_str()));
}

#[test]
#[ignore = "needs kubernetes-validate: KILN_TEST_KUBERNETES_VALIDATE (.ci/kubernetes.sh)"]
fn the_core_objects_validate_against_the_kubernetes_schemas() {
    let validator = crate::common::required_env(
        "KILN_TEST_KUBERNETES_VALIDATE",
        "kubernetes-validate with its schemas (.ci/kubernetes.sh)",
    );
    let version =
        std::env::var("KILN_KUBERNETES_SCHEMA_VERSION").unwrap_or_else(|_| "1.33.0".into());
    let run = |files: &[PathBuf]| {
        Command::new(&validator)
            .args(["--strict", "-k", &version])
            .args(files)
            .output()
            .unwrap()
    };
    // The InferenceService is a custom resource: no schema ships for it.
    let core: Vec<PathBuf> = FILES
        .iter()
        .filter(|f| !f.starts_with("kserve"))
        .map(|f| root().join("deploy/kubernetes").join(f))
        .collect();
    let o = run(&core);
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}");
    assert_eq!(out.matches("passed").count(), core.len(), "{out}");
    // The validator does reject a broken object (a misspelt field under --strict).
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.yaml");
    let text = std::fs::read_to_string(&core[3]).unwrap();
    assert!(text.contains("readinessProbe:"));
    std::fs::write(&bad, text.replace("readinessProbe:", "readynessProbe:")).unwrap();
    assert!(!run(&[bad]).status.success(), "a misspelt field passed");
}
