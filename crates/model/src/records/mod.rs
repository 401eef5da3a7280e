//! Records shared by several crates (leaves: they import nothing of this crate's layers):
//! the inference engines (one enum, parsed and spelled once), the model repository's layout,
//! the epoch record, and what a manifest records of the run that made it ([`metrics`]).

mod epoch;
pub mod metrics;
pub mod repository;

pub use epoch::{EpochRecord, StepPhases};

/// The inference engines, one variant each: parsed once from the name a user writes
/// (`FromStr`), spelled once ([`EngineKind::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// The Burn module without autodiff on Flex.
    Burn,
    /// The Burn module on NdArray.
    BurnNdArray,
    /// The compiled f32 plan.
    Fused,
    /// Per-channel int8 weights, per-row dynamic int8 activations.
    Int8,
    /// The fastest exact engine (one that computes the f32 model, bit-identical whatever
    /// the batch): the default.
    Auto,
    /// Per batch-size bucket the fastest compiled engine whose accuracy bound holds, int8
    /// included (an explicit choice: answers depend on the batch size).
    AutoInt8,
    /// Burn's CUDA backend in bf16.
    CudaBf16,
    /// Burn's CUDA backend in f32.
    CudaF32,
}

impl EngineKind {
    /// Every engine, in the order `engine_names` lists them.
    pub const ALL: [EngineKind; 8] = [
        EngineKind::Burn,
        EngineKind::BurnNdArray,
        EngineKind::Fused,
        EngineKind::Int8,
        EngineKind::Auto,
        EngineKind::AutoInt8,
        EngineKind::CudaBf16,
        EngineKind::CudaF32,
    ];

    /// The name users write (`--engine`, `export.engine`, manifests, metrics labels).
    pub const fn name(self) -> &'static str {
        match self {
            EngineKind::Burn => "burn",
            EngineKind::BurnNdArray => "burn-ndarray",
            EngineKind::Fused => "fused",
            EngineKind::Int8 => "int8",
            EngineKind::Auto => "auto",
            EngineKind::AutoInt8 => "auto-int8",
            EngineKind::CudaBf16 => "cuda-bf16",
            EngineKind::CudaF32 => "cuda-f32",
        }
    }

    /// Whether it runs on the CPU (the default set of `kiln bench infer`; `auto` chooses
    /// among them and is not one itself).
    pub const fn is_cpu(self) -> bool {
        matches!(
            self,
            EngineKind::Burn | EngineKind::BurnNdArray | EngineKind::Fused | EngineKind::Int8
        )
    }

    /// Whether its answers may differ from the f32 model's (quantised: `int8`, `auto-int8`).
    pub const fn is_quantised(self) -> bool {
        matches!(self, EngineKind::Int8 | EngineKind::AutoInt8)
    }

    /// Whether it chooses among engines at load (`auto`, `auto-int8`).
    pub const fn is_auto(self) -> bool {
        matches!(self, EngineKind::Auto | EngineKind::AutoInt8)
    }

    /// Whether it needs the `cuda` feature (and a GPU).
    pub const fn is_cuda(self) -> bool {
        matches!(self, EngineKind::CudaBf16 | EngineKind::CudaF32)
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no engine of this build; the message lists the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine `{given}`; known: {known}")]
pub struct UnknownEngine {
    /// What was given.
    pub given: String,
    /// The engines this build knows, comma-separated.
    pub known: String,
}

impl std::str::FromStr for EngineKind {
    type Err = UnknownEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownEngine {
                given: s.to_string(),
                known: engine_names().join(", "),
            })
    }
}

const fn names<const N: usize>(kinds: [EngineKind; N]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = kinds[i].name();
        i += 1;
    }
    out
}

/// The CPU inference engines (the default set of `kiln bench infer`).
pub const CPU_ENGINES: [&str; 4] = names([
    EngineKind::Burn,
    EngineKind::BurnNdArray,
    EngineKind::Fused,
    EngineKind::Int8,
]);

/// The CUDA inference engines (built with the `cuda` feature).
pub const CUDA_ENGINES: [&str; 2] = names([EngineKind::CudaBf16, EngineKind::CudaF32]);

/// The engine that picks the fastest exact CPU engine at load (`crate::infer::auto`): the
/// default of `kiln serve`, `kiln predict`, `kiln pick`, `kiln profile infer`, `kiln promote`
/// and `export.engine: null`. Its answer for a row is bit-identical whatever the batch.
pub const AUTO_ENGINE: &str = EngineKind::Auto.name();

/// The automatic choice that may pick int8 per batch-size bucket (explicit only).
pub const AUTO_INT8_ENGINE: &str = EngineKind::AutoInt8.name();

/// Engine names this build knows: the CPU engines, `auto`, then (with the `cuda` feature) the
/// CUDA ones. A name listed here may still be unavailable on this machine (no GPU).
pub fn engine_names() -> Vec<&'static str> {
    EngineKind::ALL
        .into_iter()
        .filter(|k| !k.is_cuda() || cfg!(feature = "cuda"))
        .map(EngineKind::name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::EngineKind;

    #[test]
    fn every_engine_name_parses_back_and_unknown_ones_list_the_known() {
        for k in EngineKind::ALL {
            assert_eq!(k.name().parse::<EngineKind>(), Ok(k));
        }
        let e = "fuzed".parse::<EngineKind>().unwrap_err();
        assert!(e.to_string().contains("fused, int8, auto"), "{e}");
        assert_eq!(
            super::CPU_ENGINES,
            ["burn", "burn-ndarray", "fused", "int8"]
        );
        assert!(super::engine_names().starts_with(&[
            "burn",
            "burn-ndarray",
            "fused",
            "int8",
            "auto",
            "auto-int8"
        ]));
    }
}
