//! [`HaltonMvnCdf`], the estimator as a Burn [`Module`], its config, and the one `forward` that
//! dispatches on the input type ([`MvnInput`]).

use std::sync::{Arc, RwLock};

use burn::config::Config;
use burn::module::{
    AutodiffModule, Content, Devices, HasAutodiffModule, Module, ModuleDisplay,
    ModuleDisplayDefault, ModuleMapper, ModuleVisitor, Param, ParamId,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use super::constants::{HostConstants, RawConstants};
use super::cpu::{CpuOptions, estimate_all, estimate_all_counted, factor_all};
use super::error::MvnError;
use super::halton::MAX_HALTON_DIM;
use super::query::{
    HostFloat, MvnEstimate, MvnQuery, MvnQueryBatch, MvnSlices, Prepared, prepare_queries,
    prepare_slices,
};
use super::tensor_path::{
    MvnTensorBatch, MvnTensorEstimates, OnDevice, PointSets, estimate_on_device, estimate_tensor,
    tensor_to_vec,
};
use kiln_base::simd::{Isa, Kernel};

/// Which estimator the module runs.
#[derive(Config, Debug, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString)]
#[strum(
    serialize_all = "lowercase",
    ascii_case_insensitive,
    parse_err_ty = String,
    parse_err_fn = unknown_method
)]
pub enum MvnMethod {
    /// Direct Halton estimate: the fraction of transformed points inside the box.
    Naive,
    /// Genz's separation of variables with variable reordering (the default).
    Genz,
}

impl MvnMethod {
    /// The lowercase name (`naive`, `genz`), as the CLI and JSON use it.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// `MvnMethod`'s derived `FromStr` error (any case is accepted; the message names it in
/// lowercase).
fn unknown_method(s: &str) -> String {
    let other = s.to_ascii_lowercase();
    format!("unknown method `{other}`; expected `naive` or `genz`")
}

/// The low-discrepancy point sets the estimator integrates over.
#[derive(Config, Debug, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString)]
#[strum(
    serialize_all = "lowercase",
    ascii_case_insensitive,
    parse_err_ty = String,
    parse_err_fn = unknown_point_set
)]
pub enum PointSet {
    /// Scrambled Halton sets (the default): every coordinate its own prime base.
    Halton,
    /// Scrambled Sobol' sets (base 2 in every coordinate, see [`crate::sobol`]): nets at
    /// powers of two, so smooth integrands' errors fall faster than 1/n there; the adaptive
    /// mode grows their points in powers of two.
    Sobol,
}

impl PointSet {
    /// The lowercase name (`halton`, `sobol`), as the CLI and JSON use it.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// `PointSet`'s derived `FromStr` error (any case is accepted; the message names it in
/// lowercase).
fn unknown_point_set(s: &str) -> String {
    let other = s.to_ascii_lowercase();
    format!("unknown point set `{other}`; expected `halton` or `sobol`")
}

/// Configuration of a [`HaltonMvnCdf`]; [`HaltonMvnCdfConfig::init`] builds the module.
#[derive(Config, Debug)]
pub struct HaltonMvnCdfConfig {
    /// The largest dimension d the module answers (the point set has this many coordinates).
    #[config(default = 16)]
    pub max_dim: usize,
    /// Number of Halton points n per randomisation.
    #[config(default = 4096)]
    pub points: usize,
    /// Number of independent randomisations R (scramblings of the point set); the standard
    /// error comes from the spread of their estimates.
    #[config(default = 8)]
    pub randomizations: usize,
    /// Seed of the scramblings.
    #[config(default = 0)]
    pub seed: u64,
    /// The estimator.
    #[config(default = "MvnMethod::Genz")]
    pub method: MvnMethod,
    /// Adaptive mode (CPU path, Genz method; `None`, the default, uses all `points` for every
    /// query): the standard error each query stops at. A query integrates over the first
    /// `min_points` points of every randomisation and adds points in stages (aimed at the count
    /// the 1/n decay of the standard error predicts, 1.25–2× per stage) until its standard
    /// error is at most this or all `points` are used; bivariate queries are then answered
    /// exactly. SciPy's default accuracy (absolute error 1e−5) corresponds to about 2e−6.
    /// The tensor path ignores it (it always uses every point).
    pub tolerance: Option<f64>,
    /// Adaptive mode: points per randomisation of the first stage (rounded up to a multiple
    /// of 64).
    #[config(default = 256)]
    pub min_points: usize,
    /// The point sets: scrambled Halton (the default) or scrambled Sobol'.
    #[config(default = "PointSet::Halton")]
    pub sequence: PointSet,
}

/// Largest accepted number of points per randomisation.
pub const MAX_POINTS: usize = 1 << 22;
/// Largest accepted number of randomisations.
pub const MAX_RANDOMIZATIONS: usize = 1024;

impl HaltonMvnCdfConfig {
    /// Checks the fields (sizes positive and within limits).
    pub fn validate(&self) -> Result<(), MvnError> {
        let bad = |field, value: usize, expected: String| MvnError::InvalidConfig {
            field,
            value: value.to_string(),
            expected,
        };
        if self.max_dim == 0 || self.max_dim > MAX_HALTON_DIM {
            return Err(bad(
                "max_dim",
                self.max_dim,
                format!("1 ..= {MAX_HALTON_DIM}"),
            ));
        }
        if self.points == 0 || self.points > MAX_POINTS {
            return Err(bad("points", self.points, format!("1 ..= {MAX_POINTS}")));
        }
        if self.min_points == 0 || self.min_points > MAX_POINTS {
            return Err(bad(
                "min_points",
                self.min_points,
                format!("1 ..= {MAX_POINTS}"),
            ));
        }
        if let Some(t) = self.tolerance
            && !(t.is_finite() && t > 0.0)
        {
            return Err(MvnError::InvalidConfig {
                field: "tolerance",
                value: t.to_string(),
                expected: "a finite standard error > 0 (or none, to use every point)".into(),
            });
        }
        if self.randomizations < 2 || self.randomizations > MAX_RANDOMIZATIONS {
            return Err(bad(
                "randomizations",
                self.randomizations,
                format!("2 ..= {MAX_RANDOMIZATIONS} (at least two, for a standard error)"),
            ));
        }
        Ok(())
    }

    /// Builds the module on `device`: draws the R scrambled Halton point sets from the seed and
    /// (naive method) tabulates their normal quantiles.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<HaltonMvnCdf<B>, MvnError> {
        self.validate()?;
        let raw = RawConstants::generate_set(
            self.sequence,
            self.points,
            self.max_dim,
            self.randomizations,
            self.seed,
            self.method == MvnMethod::Naive,
        );
        let constants = MvnConstants::from_raw(&raw, device);
        let host = HostConstants::from_raw(&raw, self.method == MvnMethod::Naive);
        Ok(HaltonMvnCdf {
            constants,
            method: self.method,
            seed: self.seed,
            tolerance: self.tolerance,
            min_points: self.min_points,
            sequence: self.sequence,
            host: Arc::new(RwLock::new(Some(Arc::new(host)))),
        })
    }
}

/// The module state: the precomputed constants as non-trainable parameters, so that they
/// move with [`Module::to_device`]/[`Module::fork`] and are saved and loaded with the record.
#[derive(Module, Debug)]
pub struct MvnConstants<B: Backend> {
    /// R independently scrambled Halton point sets, R × n × max_dim, in [0, 1): randomisation
    /// r integrates over `points[r]`.
    pub points: Param<Tensor<B, 3>>,
    /// Φ⁻¹ of the points, R × n × max_dim (only for the naive method).
    pub normal_quantiles: Option<Param<Tensor<B, 3>>>,
}

fn constant_param<B: Backend, const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    device: &B::Device,
) -> Param<Tensor<B, D>> {
    let t = Tensor::<B, D>::from_data(TensorData::new(values, shape), device);
    Param::initialized(ParamId::new(), t).set_require_grad(false)
}

impl<B: Backend> MvnConstants<B> {
    fn from_raw(raw: &RawConstants, device: &B::Device) -> Self {
        let shape = [raw.randomizations, raw.n, raw.max_dim];
        Self {
            points: constant_param(raw.points.clone(), shape, device),
            normal_quantiles: raw
                .quantiles
                .as_ref()
                .map(|q| constant_param(q.clone(), shape, device)),
        }
    }

    /// Reads the tensors back into host arrays.
    fn to_raw(&self) -> Result<RawConstants, MvnError> {
        let [randomizations, n, max_dim] = self.points.val().dims();
        let quantiles = match &self.normal_quantiles {
            Some(q) => {
                let qd = q.val().dims();
                if qd != [randomizations, n, max_dim] {
                    return Err(MvnError::InvalidConfig {
                        field: "normal_quantiles",
                        value: format!("shape {qd:?}"),
                        expected: format!(
                            "shape [{randomizations}, {n}, {max_dim}] (like the points)"
                        ),
                    });
                }
                Some(tensor_to_vec(q.val().reshape([-1]))?)
            }
            None => None,
        };
        Ok(RawConstants {
            n,
            max_dim,
            randomizations,
            points: tensor_to_vec(self.points.val().reshape([-1]))?,
            quantiles,
        })
    }
}

/// The Halton multivariate-normal CDF estimator.
///
/// Parameter-free and deterministic: its state is the precomputed constants
/// ([`MvnConstants`]), which move with the module between devices and are saved and loaded
/// with its record. [`HaltonMvnCdf::forward`] takes host arrays (answered by the CPU path) or
/// Burn tensors (answered by the tensor path); see [`MvnInput`].
///
/// The CPU path keeps an f64 copy of the constants, made at `init` and remade whenever the
/// module loads a record or is mapped, so it never reads tensors back per call; the tensors
/// stay the source of truth.
#[derive(Debug)]
pub struct HaltonMvnCdf<B: Backend> {
    constants: MvnConstants<B>,
    method: MvnMethod,
    seed: u64,
    tolerance: Option<f64>,
    min_points: usize,
    sequence: PointSet,
    host: Arc<RwLock<Option<Arc<HostConstants>>>>,
}

impl<B: Backend> Clone for HaltonMvnCdf<B> {
    fn clone(&self) -> Self {
        Self {
            constants: self.constants.clone(),
            method: self.method,
            seed: self.seed,
            tolerance: self.tolerance,
            min_points: self.min_points,
            sequence: self.sequence,
            host: self.host.clone(),
        }
    }
}

/// An input that [`HaltonMvnCdf::forward`] accepts. The implementation decides the path:
/// host arrays ([`MvnSlices`], [`MvnQueryBatch`], `&[MvnQuery]`) go to the CPU path, Burn
/// tensors ([`MvnTensorBatch`]) and [`OnDevice`] to the tensor path.
pub trait MvnInput<B: Backend> {
    /// What `forward` returns for this input.
    type Output;

    /// Answers the input with `model`.
    fn estimate(self, model: &HaltonMvnCdf<B>) -> Self::Output;
}

impl<B: Backend> HaltonMvnCdf<B> {
    /// Estimates P(lower ≤ X ≤ upper) for every query of `input`; see [`MvnInput`] for the
    /// accepted inputs and what each returns.
    pub fn forward<I: MvnInput<B>>(&self, input: I) -> I::Output {
        input.estimate(self)
    }

    /// The method the module runs.
    pub fn method(&self) -> MvnMethod {
        self.method
    }

    /// The seed the module was built with (a loaded record brings its own constants).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The adaptive mode's standard-error target (see [`HaltonMvnCdfConfig::tolerance`]).
    pub fn tolerance(&self) -> Option<f64> {
        self.tolerance
    }

    /// The adaptive mode's first stage, in points per randomisation.
    pub fn min_points(&self) -> usize {
        self.min_points
    }

    /// The same module (sharing its constants) with another adaptive setting: `Some(se)` turns
    /// the adaptive mode on with that standard-error target, `None` off. Invalid values (not
    /// finite, ≤ 0, `min_points` 0) are an error.
    pub fn with_adaptive(
        &self,
        tolerance: Option<f64>,
        min_points: usize,
    ) -> Result<Self, MvnError> {
        self.config()
            .with_tolerance(tolerance)
            .with_min_points(min_points)
            .validate()?;
        Ok(Self {
            tolerance,
            min_points,
            ..self.clone()
        })
    }

    /// The largest dimension the module answers.
    pub fn max_dim(&self) -> usize {
        self.constants.points.val().dims()[2]
    }

    /// Number of points per randomisation.
    pub fn points(&self) -> usize {
        self.constants.points.val().dims()[1]
    }

    /// Number of randomisations.
    pub fn randomizations(&self) -> usize {
        self.constants.points.val().dims()[0]
    }

    /// The config that rebuilds this module (from its current constants' sizes).
    pub fn config(&self) -> HaltonMvnCdfConfig {
        HaltonMvnCdfConfig::new()
            .with_max_dim(self.max_dim())
            .with_points(self.points())
            .with_randomizations(self.randomizations())
            .with_seed(self.seed)
            .with_method(self.method)
            .with_tolerance(self.tolerance)
            .with_min_points(self.min_points)
            .with_sequence(self.sequence)
    }

    /// The point sets the module was built with (a loaded record brings its own points).
    pub fn sequence(&self) -> PointSet {
        self.sequence
    }

    /// The constants, for inspection.
    pub fn constants(&self) -> &MvnConstants<B> {
        &self.constants
    }

    /// The scrambled Halton point sets, R × n × max_dim.
    pub fn halton_points(&self) -> Tensor<B, 3> {
        self.constants.points.val()
    }

    /// The normal quantiles of the points, R × n × max_dim (naive method only).
    pub fn normal_quantiles(&self) -> Option<Tensor<B, 3>> {
        self.constants.normal_quantiles.as_ref().map(|q| q.val())
    }

    /// The device the constants live on.
    pub fn device(&self) -> B::Device {
        self.constants.points.val().device()
    }

    /// The host copy of the constants, rebuilding it if a load left it empty.
    pub(crate) fn host(&self) -> Result<Arc<HostConstants>, MvnError> {
        if let Ok(guard) = self.host.read()
            && let Some(h) = guard.as_ref()
        {
            return Ok(h.clone());
        }
        let raw = self.constants.to_raw()?;
        let h = Arc::new(HostConstants::from_raw(
            &raw,
            self.method == MvnMethod::Naive,
        ));
        if let Ok(mut guard) = self.host.write() {
            *guard = Some(h.clone());
        }
        Ok(h)
    }

    /// Same module with new constants: the host copy is remade from them (eagerly; if reading
    /// them back fails, lazily at the next CPU call, which then reports the error).
    fn with_constants(self, constants: MvnConstants<B>) -> Self {
        let module = Self {
            constants,
            method: self.method,
            seed: self.seed,
            tolerance: self.tolerance,
            min_points: self.min_points,
            sequence: self.sequence,
            host: Arc::new(RwLock::new(None)),
        };
        let _ = module.host();
        module
    }

    /// How the CPU path integrates.
    pub(crate) fn cpu_options(&self) -> CpuOptions {
        CpuOptions {
            kernel: Kernel::best(),
            method: self.method,
            tolerance: self.tolerance,
            min_points: self.min_points,
            sequence: self.sequence,
        }
    }

    /// The CPU path on `queries` with its vector path forced to `isa` (`forward` takes the
    /// best one this CPU has): for tests and benchmarks of the other paths, e.g. AVX2 on an
    /// AVX-512 machine. An `isa` this CPU cannot run is an [`MvnError::InvalidConfig`].
    pub fn forward_with_isa(
        &self,
        queries: &[MvnQuery],
        isa: Isa,
    ) -> Result<Vec<MvnEstimate>, MvnError> {
        Ok(self.forward_counted(queries, Some(isa))?.0)
    }

    /// The CPU path with the points per randomisation each query used (adaptive mode stops
    /// early; exact answers count 0), on the vector path `isa` (`None`: the best this CPU
    /// has): for the benchmarks.
    pub fn forward_counted(
        &self,
        queries: &[MvnQuery],
        isa: Option<Isa>,
    ) -> Result<(Vec<MvnEstimate>, Vec<usize>), MvnError> {
        let mut opts = self.cpu_options();
        if let Some(isa) = isa {
            opts.kernel = Kernel::new(isa).ok_or_else(|| MvnError::InvalidConfig {
                field: "isa",
                value: isa.name().into(),
                expected: format!(
                    "a path this CPU runs: {}",
                    Isa::available()
                        .iter()
                        .map(|i| i.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })?;
        }
        let prepared = prepare_queries(queries, self.max_dim())?;
        let host = self.host()?;
        let factors = factor_all(&prepared, &opts)?;
        Ok(estimate_all_counted(&factors, &host, &opts))
    }

    /// The CPU path on validated queries.
    fn run_cpu(&self, prepared: Vec<Prepared>) -> Result<Vec<MvnEstimate>, MvnError> {
        let host = self.host()?;
        let opts = self.cpu_options();
        let factors = factor_all(&prepared, &opts)?;
        Ok(estimate_all(&factors, &host, &opts))
    }
}

impl<B: Backend> Module<B> for HaltonMvnCdf<B> {
    type Record = <MvnConstants<B> as Module<B>>::Record;

    fn collect_devices(&self, devices: Devices<B>) -> Devices<B> {
        self.constants.collect_devices(devices)
    }

    fn fork(self, device: &B::Device) -> Self {
        Self {
            constants: self.constants.fork(device),
            ..self
        }
    }

    fn to_device(self, device: &B::Device) -> Self {
        Self {
            constants: self.constants.to_device(device),
            ..self
        }
    }

    fn visit<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        self.constants.visit(visitor);
    }

    fn map<M: ModuleMapper<B>>(self, mapper: &mut M) -> Self {
        let constants = self.constants.clone().map(mapper);
        self.with_constants(constants)
    }

    fn load_record(self, record: Self::Record) -> Self {
        let constants = self.constants.clone().load_record(record);
        self.with_constants(constants)
    }

    fn into_record(self) -> Self::Record {
        self.constants.into_record()
    }
}

impl<B: AutodiffBackend> AutodiffModule<B> for HaltonMvnCdf<B> {
    type InnerModule = HaltonMvnCdf<B::InnerBackend>;

    fn valid(&self) -> Self::InnerModule {
        HaltonMvnCdf {
            constants: self.constants.valid(),
            method: self.method,
            seed: self.seed,
            tolerance: self.tolerance,
            min_points: self.min_points,
            sequence: self.sequence,
            host: self.host.clone(),
        }
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        HaltonMvnCdf {
            constants: MvnConstants::from_inner(module.constants),
            method: module.method,
            seed: module.seed,
            tolerance: module.tolerance,
            min_points: module.min_points,
            sequence: module.sequence,
            host: module.host,
        }
    }
}

impl<B: AutodiffBackend> HasAutodiffModule<B> for HaltonMvnCdf<B::InnerBackend> {
    type TrainModule = HaltonMvnCdf<B>;
}

impl<B: Backend> ModuleDisplayDefault for HaltonMvnCdf<B> {
    fn content(&self, content: Content) -> Option<Content> {
        content
            .add("method", &self.method.name().to_string())
            .add("max_dim", &self.max_dim())
            .add("points", &self.points())
            .add("randomizations", &self.randomizations())
            .add("seed", &self.seed)
            .add("tolerance", &format!("{:?}", self.tolerance))
            .optional()
    }

    fn num_params(&self) -> usize {
        Module::num_params(self)
    }
}

impl<B: Backend> ModuleDisplay for HaltonMvnCdf<B> {}

impl<B: Backend> std::fmt::Display for HaltonMvnCdf<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HaltonMvnCdf {{ method: {}, max_dim: {}, points: {}, randomizations: {}, seed: {}",
            self.method.name(),
            self.max_dim(),
            self.points(),
            self.randomizations(),
            self.seed
        )?;
        match self.tolerance {
            Some(t) => write!(f, ", tolerance: {t:e}, min_points: {} }}", self.min_points),
            None => write!(f, " }}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs.
// ---------------------------------------------------------------------------------------------

impl<B: Backend, T: HostFloat> MvnInput<B> for MvnSlices<'_, T> {
    type Output = Result<Vec<MvnEstimate>, MvnError>;

    fn estimate(self, model: &HaltonMvnCdf<B>) -> Self::Output {
        let _span = tracing::debug_span!("mvn.forward", path = "cpu", dim = self.dim).entered();
        let prepared = prepare_slices(&self, model.max_dim())?;
        model.run_cpu(prepared)
    }
}

impl<B: Backend> MvnInput<B> for &[MvnQuery] {
    type Output = Result<Vec<MvnEstimate>, MvnError>;

    fn estimate(self, model: &HaltonMvnCdf<B>) -> Self::Output {
        let _span =
            tracing::debug_span!("mvn.forward", path = "cpu", queries = self.len()).entered();
        let prepared = prepare_queries(self, model.max_dim())?;
        model.run_cpu(prepared)
    }
}

impl<B: Backend> MvnInput<B> for &MvnQueryBatch {
    type Output = Result<Vec<MvnEstimate>, MvnError>;

    fn estimate(self, model: &HaltonMvnCdf<B>) -> Self::Output {
        self.queries.as_slice().estimate(model)
    }
}

impl<B: Backend> MvnInput<B> for MvnTensorBatch<B> {
    type Output = Result<MvnTensorEstimates<B>, MvnError>;

    fn estimate(self, model: &HaltonMvnCdf<B>) -> Self::Output {
        let _span = tracing::debug_span!("mvn.forward", path = "tensor").entered();
        estimate_tensor(model, self)
    }
}

impl<B: Backend> MvnInput<B> for OnDevice<'_> {
    type Output = Result<Vec<MvnEstimate>, MvnError>;

    fn estimate(self, model: &HaltonMvnCdf<B>) -> Self::Output {
        let _span = tracing::debug_span!("mvn.forward", path = "tensor-mixed").entered();
        estimate_on_device(model, self.0)
    }
}

impl<B: Backend> PointSets<B> for HaltonMvnCdf<B> {
    fn method(&self) -> MvnMethod {
        self.method
    }
    fn halton_points(&self) -> Tensor<B, 3> {
        self.constants.points.val()
    }
    fn normal_quantiles(&self) -> Option<Tensor<B, 3>> {
        self.constants.normal_quantiles.as_ref().map(|q| q.val())
    }
    fn max_dim(&self) -> usize {
        HaltonMvnCdf::max_dim(self)
    }
    fn points(&self) -> usize {
        HaltonMvnCdf::points(self)
    }
    fn randomizations(&self) -> usize {
        HaltonMvnCdf::randomizations(self)
    }
    fn device(&self) -> B::Device {
        HaltonMvnCdf::device(self)
    }
}
