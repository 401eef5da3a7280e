//! Records shared by several crates (leaves: they import nothing of this crate's layers):
//! the inference engines (one enum, parsed and spelled once), the model repository's layout,
//! the epoch record, and what a manifest records of the run that made it ([`metrics`]).

mod epoch;
pub mod metrics;
pub mod repository;

pub use epoch::{EpochRecord, StepPhases};

pub use engine_text::EngineKind;

/// The engine enum alone: strum's `const_into_str` derives an undocumented
/// `EngineKind::into_str` (the text [`EngineKind::name`] returns), hence the `allow`.
#[allow(missing_docs)]
mod engine_text {
    /// The inference engines, one variant each: the text (`--engine`, `export.engine`, manifests,
    /// metrics labels) is derived once from the `strum` attributes below: [`EngineKind::name`],
    /// `Display`, `FromStr` (whose error, [`UnknownEngine`](super::UnknownEngine), lists the
    /// engines this build knows) and, through them, serde.
    #[derive(
        Debug,
        Clone,
        Copy,
        PartialEq,
        Eq,
        Hash,
        Default,
        strum::IntoStaticStr,
        strum::Display,
        strum::EnumString,
        strum::EnumIter,
        strum::VariantArray,
        strum::VariantNames,
    )]
    #[strum(
        const_into_str,
        parse_err_ty = super::UnknownEngine,
        parse_err_fn = super::UnknownEngine::of
    )]
    pub enum EngineKind {
        /// The Burn module without autodiff on Flex.
        #[strum(serialize = "burn")]
        Burn,
        /// The Burn module on NdArray.
        #[strum(serialize = "burn-ndarray")]
        BurnNdArray,
        /// The compiled f32 plan.
        #[strum(serialize = "fused")]
        Fused,
        /// Per-channel int8 weights, per-row dynamic int8 activations.
        #[strum(serialize = "int8")]
        Int8,
        /// The fastest exact engine (one that computes the f32 model, bit-identical whatever
        /// the batch): the default.
        #[default]
        #[strum(serialize = "auto")]
        Auto,
        /// Per batch-size bucket the fastest compiled engine whose accuracy bound holds, int8
        /// included (an explicit choice: answers depend on the batch size).
        #[strum(serialize = "auto-int8")]
        AutoInt8,
        /// Burn's CUDA backend in bf16.
        #[strum(serialize = "cuda-bf16")]
        CudaBf16,
        /// Burn's CUDA backend in f32.
        #[strum(serialize = "cuda-f32")]
        CudaF32,
    }
}

impl EngineKind {
    /// Every engine, in the order `engine_names` lists them.
    pub const ALL: &'static [EngineKind] = <EngineKind as strum::VariantArray>::VARIANTS;

    /// The name users write (`--engine`, `export.engine`, manifests, metrics labels).
    pub const fn name(self) -> &'static str {
        self.into_str()
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

    /// Whether this build has it (the CUDA engines need the `cuda` feature); an engine it has
    /// may still be unavailable on this machine (no GPU).
    pub const fn is_built(self) -> bool {
        !self.is_cuda() || cfg!(feature = "cuda")
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

impl UnknownEngine {
    /// `given` is no engine name (`EngineKind`'s derived `FromStr` error).
    pub fn of(given: &str) -> Self {
        UnknownEngine {
            given: given.to_string(),
            known: engine_names().join(", "),
        }
    }
}

/// An engine equals its name (`kind == "int8"`), so that text read back from a record or a
/// test's expectation compares without parsing.
impl PartialEq<str> for EngineKind {
    fn eq(&self, other: &str) -> bool {
        self.name() == other
    }
}

impl PartialEq<&str> for EngineKind {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

impl serde::Serialize for EngineKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for EngineKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
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
        .iter()
        .filter(|k| k.is_built())
        .map(|k| k.name())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::EngineKind;

    #[test]
    fn every_engine_name_parses_back_and_unknown_ones_list_the_known() {
        for &k in EngineKind::ALL {
            assert_eq!(k.name().parse::<EngineKind>(), Ok(k));
            assert_eq!(k.to_string(), k.name());
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.name()));
            assert_eq!(serde_json::from_str::<EngineKind>(&json).unwrap(), k);
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
