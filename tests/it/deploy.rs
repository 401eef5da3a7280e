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

// ---------------------------------------------------------------------------------------
// Pod Security Standards, "restricted" profile.
//
// The rules are those of the official list, https://kubernetes.io/docs/concepts/security/
// pod-security-standards/ (policy version "latest", Kubernetes 1.33), as enforced by the
// Pod Security Admission controller (k8s.io/pod-security-admission, policy/check_*.go). No
// evaluator of them ships on a registry this build can use (the official one is a Go
// module; kyverno, kubesec and polaris are Go binaries), so the rules are written out here,
// one function per rule, each with a negative fixture below proving it rejects a
// non-compliant pod. "Containers" means containers, initContainers and ephemeralContainers.
//
// Baseline (which restricted includes):
//   hostProcess       windowsOptions.hostProcess unset or false (pod and containers)
//   hostNamespaces    hostNetwork, hostPID, hostIPC unset or false
//   privileged        securityContext.privileged unset or false
//   capabilities      (restricted tightens this, below)
//   hostPathVolumes   no hostPath volume
//   hostPorts         ports[*].hostPort unset or 0
//   appArmor          appArmorProfile.type unset, RuntimeDefault or Localhost (pod and
//                     containers); the legacy annotations runtime/default or localhost/*
//   seLinux           seLinuxOptions.type unset or container_t, container_init_t,
//                     container_kvm_t, container_engine_t; .user and .role unset
//   procMount         unset or Default
//   seccomp           seccompProfile.type not Unconfined (pod and containers)
//   sysctls           only the safe set (see SAFE_SYSCTLS)
// Restricted:
//   volumeTypes       only configMap, csi, downwardAPI, emptyDir, ephemeral,
//                     persistentVolumeClaim, projected, secret
//   privilegeEscalation  allowPrivilegeEscalation: false on every container
//   runAsNonRoot      pod runAsNonRoot: true, or every container's; no container false
//   runAsUser         runAsUser not 0 (pod and containers)
//   seccompRestricted pod seccompProfile.type RuntimeDefault or Localhost, or every
//                     container's
//   capabilitiesRestricted  every container drops ALL and adds nothing but NET_BIND_SERVICE
//
// On top of the profile, kiln's own rules for the shipped objects (what a platform team
// asks for beyond admission): explicit non-zero runAsUser/runAsGroup/fsGroup on the pod, a
// read-only root file system on every container, and a writable /tmp volume.
// ---------------------------------------------------------------------------------------

/// The sysctls the baseline profile allows.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// The volume sources the restricted profile allows.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Every container of a pod spec (containers, initContainers, ephemeralContainers).
fn all_containers(spec: &Value) -> Vec<&Value> {
    ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten())
        .collect()
}

/// The names of the restricted-profile rules (and kiln's own) that the pod `spec` with pod
/// `annotations` breaks; empty when it complies.
fn restricted_violations(spec: &Value, annotations: &Value) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut fail = |rule: &'static str, broken: bool| {
        if broken && !out.contains(&rule) {
            out.push(rule);
        }
    };
    let pod = &spec["securityContext"];
    let containers = all_containers(spec);
    let ctx = |c: &Value| c["securityContext"].clone();
    let is_true = |v: &Value| v.as_bool() == Some(true);
    let is_false = |v: &Value| v.as_bool() == Some(false);
    // Pod and container security contexts, for the rules that apply to both.
    let mut contexts: Vec<Value> = vec![pod.clone()];
    contexts.extend(containers.iter().map(|c| ctx(c)));

    // Baseline.
    fail(
        "hostProcess",
        contexts
            .iter()
            .any(|s| is_true(&s["windowsOptions"]["hostProcess"])),
    );
    fail(
        "hostNamespaces",
        ["hostNetwork", "hostPID", "hostIPC"]
            .iter()
            .any(|k| is_true(&spec[*k])),
    );
    fail(
        "privileged",
        containers.iter().any(|c| is_true(&ctx(c)["privileged"])),
    );
    fail(
        "hostPathVolumes",
        spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v.get("hostPath").is_some()),
    );
    fail(
        "hostPorts",
        containers.iter().any(|c| {
            c["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["hostPort"].as_u64().is_some_and(|h| h != 0))
        }),
    );
    let apparmor_ok = |s: &Value| {
        matches!(
            s["appArmorProfile"]["type"].as_str(),
            None | Some("RuntimeDefault" | "Localhost")
        )
    };
    let annotation_ok = |(k, v): (&String, &Value)| {
        !k.starts_with("container.apparmor.security.beta.kubernetes.io/")
            || v.as_str()
                .is_some_and(|v| v == "runtime/default" || v.starts_with("localhost/"))
    };
    fail(
        "appArmor",
        !contexts.iter().all(apparmor_ok)
            || !annotations
                .as_object()
                .is_none_or(|a| a.iter().all(annotation_ok)),
    );
    fail(
        "seLinux",
        contexts.iter().any(|s| {
            let o = &s["seLinuxOptions"];
            !matches!(
                o["type"].as_str(),
                None | Some(
                    "container_t" | "container_init_t" | "container_kvm_t" | "container_engine_t"
                )
            ) || !o["user"].is_null()
                || !o["role"].is_null()
        }),
    );
    fail(
        "procMount",
        containers
            .iter()
            .any(|c| !matches!(ctx(c)["procMount"].as_str(), None | Some("Default"))),
    );
    fail(
        "seccomp",
        contexts
            .iter()
            .any(|s| s["seccompProfile"]["type"] == "Unconfined"),
    );
    fail(
        "sysctls",
        pod["sysctls"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| !SAFE_SYSCTLS.contains(&s["name"].as_str().unwrap_or(""))),
    );

    // Restricted.
    fail(
        "volumeTypes",
        spec["volumes"].as_array().into_iter().flatten().any(|v| {
            v.as_object().is_none_or(|o| {
                o.keys()
                    .filter(|k| *k != "name")
                    .any(|k| !RESTRICTED_VOLUMES.contains(&k.as_str()))
            })
        }),
    );
    fail(
        "privilegeEscalation",
        containers
            .iter()
            .any(|c| !is_false(&ctx(c)["allowPrivilegeEscalation"])),
    );
    fail(
        "runAsNonRoot",
        containers.iter().any(|c| is_false(&ctx(c)["runAsNonRoot"]))
            || !(is_true(&pod["runAsNonRoot"])
                || containers.iter().all(|c| is_true(&ctx(c)["runAsNonRoot"]))),
    );
    fail(
        "runAsUser",
        contexts.iter().any(|s| s["runAsUser"].as_u64() == Some(0)),
    );
    let seccomp_set = |s: &Value| {
        matches!(
            s["seccompProfile"]["type"].as_str(),
            Some("RuntimeDefault" | "Localhost")
        )
    };
    fail(
        "seccompRestricted",
        !(seccomp_set(pod) || containers.iter().all(|c| seccomp_set(&ctx(c))))
            || containers.iter().any(|c| {
                let t = &ctx(c)["seccompProfile"]["type"];
                !t.is_null() && !seccomp_set(&ctx(c))
            }),
    );
    fail(
        "capabilitiesRestricted",
        containers.iter().any(|c| {
            let caps = &ctx(c)["capabilities"];
            let drops_all = caps["drop"]
                .as_array()
                .is_some_and(|d| d.iter().any(|x| x == "ALL"));
            let adds_only_bind = caps["add"]
                .as_array()
                .into_iter()
                .flatten()
                .all(|x| x == "NET_BIND_SERVICE");
            !drops_all || !adds_only_bind
        }),
    );

    // kiln's own.
    fail(
        "kilnPodIdentity",
        ["runAsUser", "runAsGroup", "fsGroup"]
            .iter()
            .any(|k| pod[*k].as_u64().is_none_or(|id| id == 0)),
    );
    fail(
        "kilnReadOnlyRoot",
        containers
            .iter()
            .any(|c| !is_true(&ctx(c)["readOnlyRootFilesystem"])),
    );
    fail(
        "kilnWritableTmp",
        spec["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                !c["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["mountPath"] == "/tmp" && !is_true(&m["readOnly"]))
            }),
    );
    out
}

/// The annotations of a workload's pods.
fn pod_annotations(obj: &Value) -> &Value {
    match obj["kind"].as_str().unwrap() {
        "CronJob" => &obj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"],
        "Deployment" | "Job" => &obj["spec"]["template"]["metadata"]["annotations"],
        _ => &obj["metadata"]["annotations"],
    }
}

/// JSON pointers of every `containers` list in `v` (where pod specs are).
fn container_lists(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                let here = format!("{at}/{k}");
                if k == "containers" {
                    out.push(here.clone());
                }
                container_lists(x, &here, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                container_lists(x, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn every_workload_meets_pod_security_restricted() {
    let mut workloads = 0;
    for f in FILES {
        let obj = k8s(f);
        let mut lists = Vec::new();
        container_lists(&obj, "", &mut lists);
        if lists.is_empty() {
            continue;
        }
        // Every pod spec in the file is one the check below reaches.
        let spec = pod_spec(&obj);
        assert_eq!(lists.len(), 1, "{f}: pod specs at {lists:?}");
        assert!(
            std::ptr::eq(obj.pointer(&lists[0]).unwrap(), &spec["containers"]),
            "{f}: a pod spec at {} the policy check does not read",
            lists[0]
        );
        let broken = restricted_violations(spec, pod_annotations(&obj));
        assert!(broken.is_empty(), "{f} breaks {broken:?}");
        workloads += 1;
    }
    // serve Deployment, retrain CronJob, sweep Job, KServe predictor.
    assert_eq!(workloads, 4);

    // Where kiln writes is a writable volume: the promoter's repository, the sweep's and
    // the retraining's run roots (the root file system is read-only).
    let writable = |obj: &Value, path: &str| {
        pod_spec(obj)["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| path.starts_with(m["mountPath"].as_str().unwrap()) && m["readOnly"] != true)
    };
    let cron = k8s("retrain-cronjob.yaml");
    for inv in invocations(container(&cron)) {
        for t in &inv {
            if let Some(dir) = t.strip_prefix("export.dir=") {
                assert!(writable(&cron, dir), "retrain writes {dir}");
            }
        }
        if let Some(repo) = flag_value(&inv, "--repository") {
            assert!(writable(&cron, repo), "promote writes {repo}");
        }
    }
    let job = k8s("sweep-job.yaml");
    let inv = &invocations(container(&job))[0];
    let dir = flag_value(inv, "--set")
        .and_then(|s| s.strip_prefix("export.dir="))
        .expect("the sweep places its run directory with --set export.dir=…");
    assert!(writable(&job, dir), "the sweep writes {dir}");
}

#[test]
fn the_restricted_check_rejects_each_broken_rule() {
    let deploy = k8s("serve-deployment.yaml");
    let good = pod_spec(&deploy).clone();
    assert!(restricted_violations(&good, &Value::Null).is_empty());
    // (the rules broken, `+`-separated; JSON pointer into the pod spec; the value set there).
    // A hostPath volume breaks the restricted volume list as well, and an Unconfined
    // container seccomp profile both seccomp rules, as in the admission controller.
    let c = "/containers/0/securityContext";
    let cases: Vec<(&str, String, Value)> = vec![
        (
            "hostProcess",
            "/securityContext/windowsOptions".into(),
            serde_json::json!({"hostProcess": true}),
        ),
        ("hostNamespaces", "/hostNetwork".into(), true.into()),
        ("hostNamespaces", "/hostPID".into(), true.into()),
        ("hostNamespaces", "/hostIPC".into(), true.into()),
        ("privileged", format!("{c}/privileged"), true.into()),
        (
            "hostPathVolumes+volumeTypes",
            "/volumes/1".into(),
            serde_json::json!({"name": "tmp", "hostPath": {"path": "/tmp"}}),
        ),
        (
            "hostPorts",
            "/containers/0/ports/0/hostPort".into(),
            8000.into(),
        ),
        (
            "appArmor",
            format!("{c}/appArmorProfile"),
            serde_json::json!({"type": "Unconfined"}),
        ),
        (
            "seLinux",
            "/securityContext/seLinuxOptions".into(),
            serde_json::json!({"type": "spc_t"}),
        ),
        (
            "seLinux",
            format!("{c}/seLinuxOptions"),
            serde_json::json!({"user": "system_u"}),
        ),
        ("procMount", format!("{c}/procMount"), "Unmasked".into()),
        (
            "seccomp+seccompRestricted",
            format!("{c}/seccompProfile"),
            serde_json::json!({"type": "Unconfined"}),
        ),
        (
            "sysctls",
            "/securityContext/sysctls".into(),
            serde_json::json!([{"name": "kernel.msgmax", "value": "65536"}]),
        ),
        (
            "volumeTypes",
            "/volumes/1".into(),
            serde_json::json!({"name": "tmp", "nfs": {"server": "x", "path": "/"}}),
        ),
        (
            "privilegeEscalation",
            format!("{c}/allowPrivilegeEscalation"),
            true.into(),
        ),
        (
            "privilegeEscalation",
            format!("{c}/allowPrivilegeEscalation"),
            Value::Null,
        ),
        (
            "runAsNonRoot",
            "/securityContext/runAsNonRoot".into(),
            false.into(),
        ),
        ("runAsNonRoot", format!("{c}/runAsNonRoot"), false.into()),
        ("runAsUser", format!("{c}/runAsUser"), 0.into()),
        (
            "seccompRestricted",
            "/securityContext/seccompProfile".into(),
            Value::Null,
        ),
        (
            "capabilitiesRestricted",
            format!("{c}/capabilities"),
            serde_json::json!({"drop": ["NET_RAW"]}),
        ),
        (
            "capabilitiesRestricted",
            format!("{c}/capabilities"),
            serde_json::json!({"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        ),
        (
            "kilnPodIdentity",
            "/securityContext/fsGroup".into(),
            0.into(),
        ),
        (
            "kilnPodIdentity",
            "/securityContext/runAsGroup".into(),
            Value::Null,
        ),
        (
            "kilnReadOnlyRoot",
            format!("{c}/readOnlyRootFilesystem"),
            false.into(),
        ),
        (
            "kilnWritableTmp",
            "/containers/0/volumeMounts/1/readOnly".into(),
            true.into(),
        ),
    ];
    for (rule, pointer, value) in cases {
        let mut spec = good.clone();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        let slot = spec
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{rule}: no {parent} in the Deployment's pod spec"));
        match slot {
            Value::Object(o) => {
                o.insert(key.to_string(), value);
            }
            Value::Array(a) => a[key.parse::<usize>().unwrap()] = value,
            _ => panic!("{rule}: {parent} is not a container"),
        }
        assert_eq!(
            restricted_violations(&spec, &Value::Null),
            rule.split('+').collect::<Vec<_>>(),
            "{rule} at {pointer}"
        );
    }
    // An init container is a container too; the legacy AppArmor annotation is read.
    let mut spec = good.clone();
    let mut init = spec["containers"][0].clone();
    init["securityContext"]["allowPrivilegeEscalation"] = true.into();
    spec["initContainers"] = serde_json::json!([init]);
    assert_eq!(
        restricted_violations(&spec, &Value::Null),
        ["privilegeEscalation"]
    );
    let unconfined = serde_json::json!({
        "container.apparmor.security.beta.kubernetes.io/kiln": "unconfined"
    });
    assert_eq!(restricted_violations(&good, &unconfined), ["appArmor"]);
}

#[test]
fn the_image_runs_as_a_numeric_user_owning_its_working_directories() {
    let text = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    let runtime = text.rsplit("\nFROM ").next().unwrap();
    // Numeric uid:gid (runAsNonRoot can only verify a numeric user), matching the pods'.
    let user = runtime
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("USER "))
        .expect("a USER line");
    let (uid, gid) = user.split_once(':').expect("USER uid:gid");
    let (uid, gid): (u64, u64) = (uid.parse().unwrap(), gid.parse().unwrap());
    assert!(uid != 0 && gid != 0, "USER {user}");
    for f in [
        "serve-deployment.yaml",
        "retrain-cronjob.yaml",
        "sweep-job.yaml",
    ] {
        let obj = k8s(f);
        let pod = &pod_spec(&obj)["securityContext"];
        assert_eq!(pod["runAsUser"].as_u64(), Some(uid), "{f}");
        assert_eq!(pod["runAsGroup"].as_u64(), Some(gid), "{f}");
    }
    // The working directory, its default run root and the scratch/repository mount points
    // are chowned to the user (a `chown` line naming each).
    let workdir = runtime
        .lines()
        .find_map(|l| l.trim().strip_prefix("WORKDIR "))
        .expect("a WORKDIR");
    let chowned: Vec<&str> = runtime
        .split("chown ")
        .skip(1)
        .flat_map(|s| s.lines().next().unwrap_or("").split_whitespace().skip(1))
        .collect();
    let run_root = format!("{workdir}/checkpoints");
    for dir in [workdir, run_root.as_str(), "/work", "/models"] {
        assert!(chowned.contains(&dir), "{dir} is not chowned: {chowned:?}");
    }
}
