//! Finite or refused: weights that are not finite are refused at export, at load and at
//! `kiln checkpoint reseal` (naming the tensor and index; import is in `import.rs`),
//! normalisation statistics must be finite with std > 0, features must be finite *as f32* in
//! `kiln predict` and `kiln pick`, and a prediction that is not finite is an error naming the
//! row, never `inf` or `NaN` in the output.

use std::path::{Path, PathBuf};

use crate::common::{copy_dir, kiln, trained};

use crate::common::stderr;
use kiln::artifact::{
    ArtifactError, Checkpoint, HostWeights, WEIGHTS_FILE, export, read_manifest,
    tensors_to_safetensors, write_manifest,
};

/// A copy of the trained checkpoint whose weights file holds `weights` (written as is, not
/// checked), with the manifest's weights hash updated and re-sealed: everything is
/// consistent except the values themselves.
fn with_raw_weights(dir: &Path, weights: &HostWeights) -> PathBuf {
    let ckpt = dir.join("ckpt");
    copy_dir(trained(), &ckpt);
    let bytes = tensors_to_safetensors(&weights.to_tensors());
    std::fs::write(ckpt.join(WEIGHTS_FILE), &bytes).unwrap();
    let mut m = read_manifest(&ckpt).unwrap();
    m.weights.sha256 = kiln::util::sha256_hex(&bytes);
    write_manifest(&ckpt, &mut m).unwrap();
    ckpt
}

#[test]
fn non_finite_weights_are_refused_at_export_load_and_reseal_naming_tensor_and_index() {
    let tmp = tempfile::tempdir().unwrap();
    let good = Checkpoint::load(trained()).unwrap();
    let mut w = good.weights.clone();
    // Burn layout [in, out]: input 3 → output 5 of the first layer is PyTorch's [5, 3].
    let fan_out = w.backbone[0].fan_out;
    w.backbone[0].w[3 * fan_out + 5] = f32::NAN;

    // Export: refused before anything is written.
    let dest = tmp.path().join("exported");
    let e = export(&dest, good.manifest.clone(), &w).unwrap_err();
    assert!(matches!(e, ArtifactError::NotFinite { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("tensor `backbone.0.weight` has NaN at index [5, 3]"),
        "{e}"
    );
    assert!(!dest.exists(), "nothing exported");
    let mut inf = good.weights.clone();
    inf.logvar_head.b[1] = f32::INFINITY;
    let e = export(&dest, good.manifest.clone(), &inf)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tensor `logvar_head.bias` has inf at index [1]"),
        "{e}"
    );

    // Load: a consistent, sealed checkpoint whose weights hold a NaN.
    let ckpt = with_raw_weights(tmp.path(), &w);
    let e = Checkpoint::load(&ckpt).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors")
            && e.contains("tensor `backbone.0.weight` has NaN at index [5, 3]"),
        "{e}"
    );
    let input = tmp.path().join("rows.csv");
    write_rows(&input, &[]);
    let o = kiln(&[
        "predict",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("backbone.0.weight"), "{}", stderr(&o));

    // Reseal: refused too (exit 2), the manifest left as it was.
    let before = std::fs::read(ckpt.join("manifest.json")).unwrap();
    let o = kiln(&["checkpoint", "reseal", ckpt.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("tensor `backbone.0.weight` has NaN at index [5, 3]"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(ckpt.join("manifest.json")).unwrap(), before);
}

#[test]
fn reseal_refuses_statistics_that_are_not_finite_or_a_std_that_is_not_positive() {
    for (section, key, value, want) in [
        ("targets", "std", serde_json::json!(-1.0), "std is -1"),
        ("features", "std", serde_json::json!(0.0), "std is 0"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let ckpt = tmp.path().join("ckpt");
        copy_dir(trained(), &ckpt);
        let mpath = ckpt.join("manifest.json");
        let text = std::fs::read_to_string(&mpath).unwrap();
        let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
        let name = m[section][1]["name"].as_str().unwrap().to_string();
        m[section][1][key] = value.clone();
        std::fs::write(&mpath, serde_json::to_string_pretty(&m).unwrap()).unwrap();
        let o = kiln(&["checkpoint", "reseal", ckpt.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{section}.{key}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("manifest.json")
                && err.contains(&format!("{section}[1] (`{name}`): {want}")),
            "{section}.{key} = {value}: {err}"
        );
    }
}

/// A predict input with the trained model's features: one row at the training means, then
/// `extra` rows (feature values in order).
fn write_rows(path: &Path, extra: &[Vec<String>]) {
    let m = read_manifest(trained()).unwrap();
    let mut text = format!("id,{}\n", m.feature_names().join(","));
    let means: Vec<String> = m.features.iter().map(|f| f.mean.to_string()).collect();
    text.push_str(&format!("a,{}\n", means.join(",")));
    for (i, r) in extra.iter().enumerate() {
        text.push_str(&format!("r{i},{}\n", r.join(",")));
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn predict_and_pick_refuse_a_feature_that_is_infinite_in_f32() {
    let tmp = tempfile::tempdir().unwrap();
    let m = read_manifest(trained()).unwrap();
    let mut row: Vec<String> = m.features.iter().map(|f| f.mean.to_string()).collect();
    row[2] = "3.5e38".into(); // finite in f64, inf in f32
    let input = tmp.path().join("rows.csv");
    write_rows(&input, &[row.clone()]);
    let out = tmp.path().join("out.csv");
    let o = kiln(&[
        "predict",
        "--checkpoint",
        trained().to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    let col = &m.features[2].name;
    assert!(
        err.contains(&format!("rows.csv:3: column `{col}`"))
            && err.contains("within f32's range")
            && err.contains("3.5e38"),
        "{err}"
    );
    assert!(!out.exists());

    // `kiln pick` with the rows inline in the legs file.
    let legs = tmp.path().join("legs.csv");
    let t = &m.targets[0].name;
    std::fs::write(
        &legs,
        format!(
            "target,line,side,{}\n{t},0.05,over,{}\n",
            m.feature_names().join(","),
            row.join(",")
        ),
    )
    .unwrap();
    let o = kiln(&[
        "pick",
        "--checkpoint",
        trained().to_str().unwrap(),
        "--legs",
        legs.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("legs.csv:2: column `{col}`")) && err.contains("within f32's range"),
        "{err}"
    );
}

#[test]
fn a_prediction_that_is_not_finite_is_an_error_naming_the_row_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let good = Checkpoint::load(trained()).unwrap();
    // Finite weights whose log-variance overflows f32 once exponentiated: std = e^100 · σ.
    let mut w = good.weights.clone();
    for b in &mut w.logvar_head.b {
        *b = 200.0;
    }
    let ckpt = tmp.path().join("overflowing");
    export(&ckpt, good.manifest.clone(), &w).unwrap();
    let input = tmp.path().join("rows.csv");
    write_rows(&input, &[]);
    let out = tmp.path().join("out.csv");
    let o = kiln(&[
        "predict",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    let t = &good.manifest.targets[0].name;
    assert!(
        err.contains(&format!(
            "rows.csv:2: row 1: the prediction `{t}_std` is inf"
        )),
        "{err}"
    );
    assert!(!out.exists(), "no output with inf in it");
    // To stdout: nothing either.
    let o = kiln(&[
        "predict",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}
