//! SIMD for every CPU kernel in kiln: one design for the f32 inference kernels (fused, int8)
//! and the f64 Genz kernel of the MVN estimator.
//!
//! **A token proves the CPU feature.** [`Avx512`], [`Avx2`] and [`Avx512Vnni`] are zero-sized
//! types with a private field: the only way to get one is its `new()`, which returns `None`
//! unless run-time detection found the instructions on this CPU. Everything that executes
//! those instructions needs a token:
//! * [`F32x`] is implemented by the tokens themselves; its methods take the token as `self`,
//!   so an f32 kernel, generic over `S: F32x`, cannot run without one;
//! * [`F64s`] vector values (`avx2::V4`, `avx512::V8`) can be created only by
//!   [`F64s::splat`] / [`F64s::load`], which take the token, and every other operation starts
//!   from an existing value — a value is itself the proof;
//! * the `#[target_feature]` entry points of the kernels take the token as an argument, and
//!   engines store a [`Kernel`] (a token) rather than an [`Isa`] name.
//!
//! Kernels are written once, generic over the vector trait, with every method
//! `#[inline(always)]`: instantiated inside a `#[target_feature(enable = "avx512f")]` entry
//! point the kernel compiles to AVX-512 code, inside an `avx2,fma` one to AVX2, and inside a
//! plain function to the baseline target ([`Portable`]: plain arrays that LLVM vectorises to
//! SSE2 on x86-64 or NEON on aarch64).
//!
//! [`Isa`] is the public name of a path (for options, reports and benchmarks);
//! [`Kernel::new`] turns a name into a proof, or refuses on a CPU that lacks it — which is
//! how tests and benchmarks force every path the machine has.

pub mod f32x;
pub mod f64x;

pub use f32x::F32x;
pub use f32x::measure_peak_gflops;
pub use f64x::F64s;

/// Instruction sets the CPU kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// AVX-512F (16 f32 lanes, 32 registers); the int8 engine also needs AVX-512 VNNI+BW.
    Avx512,
    /// AVX2 + FMA (8 f32 lanes, 16 registers).
    Avx2,
    /// Portable code (8-lane arrays vectorised by the compiler for the baseline target).
    Portable,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Every instruction set this CPU can run, best first.
    pub fn available() -> Vec<Isa> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2);
            }
        }
        v.push(Isa::Portable);
        v
    }

    /// Whether this CPU can run `self`.
    pub fn is_supported(self) -> bool {
        Isa::available().contains(&self)
    }

    /// A short name (`avx512`, `avx2`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    /// f32 lanes per vector.
    pub fn lanes(self) -> usize {
        match self {
            Isa::Avx512 => 16,
            Isa::Avx2 | Isa::Portable => 8,
        }
    }

    /// Peak f32 FLOP per cycle per core (two FMA pipes): used only to describe results.
    pub fn flop_per_cycle(self) -> usize {
        2 * 2 * self.lanes()
    }
}
/// Proof that this CPU runs AVX-512F. Only [`Avx512::new`] makes one.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub struct Avx512 {
    _proof: (),
}

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    /// The token, when this CPU has AVX-512F.
    pub fn new() -> Option<Self> {
        std::is_x86_feature_detected!("avx512f").then_some(Avx512 { _proof: () })
    }
}

/// Proof that this CPU runs AVX2 and FMA. Only [`Avx2::new`] makes one.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub struct Avx2 {
    _proof: (),
}

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    /// The token, when this CPU has AVX2 and FMA.
    pub fn new() -> Option<Self> {
        (std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"))
            .then_some(Avx2 { _proof: () })
    }
}

/// Proof that this CPU runs AVX-512F with the VNNI integer dot products (the int8 engine's
/// fast path). Only [`Avx512Vnni::new`] makes one.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub struct Avx512Vnni {
    avx512: Avx512,
}

#[cfg(target_arch = "x86_64")]
impl Avx512Vnni {
    /// The token, when this CPU has AVX-512F and AVX-512 VNNI.
    pub fn new() -> Option<Self> {
        let avx512 = Avx512::new()?;
        std::is_x86_feature_detected!("avx512vnni").then_some(Avx512Vnni { avx512 })
    }

    /// The AVX-512F token it contains.
    pub fn avx512(self) -> Avx512 {
        self.avx512
    }
}

/// The portable path: needs nothing, so anyone may make one.
#[derive(Debug, Clone, Copy)]
pub struct Portable;

/// A proven path: the token of one instruction set.
#[derive(Debug, Clone, Copy)]
pub enum Kernel {
    /// AVX-512F.
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
    /// AVX2 + FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    /// Portable lanes.
    Portable(Portable),
}

impl Kernel {
    /// The path `isa`, when this CPU can run it.
    pub fn new(isa: Isa) -> Option<Kernel> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Avx512::new().map(Kernel::Avx512),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Avx2::new().map(Kernel::Avx2),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2 => None,
            Isa::Portable => Some(Kernel::Portable(Portable)),
        }
    }

    /// The best path of this CPU.
    pub fn best() -> Kernel {
        Kernel::new(Isa::detect()).unwrap_or(Kernel::Portable(Portable))
    }

    /// Its name.
    pub fn isa(self) -> Isa {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512(_) => Isa::Avx512,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2(_) => Isa::Avx2,
            Kernel::Portable(_) => Isa::Portable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_exists_exactly_for_the_paths_the_cpu_reports() {
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
            let k = Kernel::new(isa);
            assert_eq!(k.is_some(), isa.is_supported(), "{isa:?}");
            if let Some(k) = k {
                assert_eq!(k.isa(), isa);
            }
        }
        assert_eq!(Kernel::best().isa(), Isa::detect());
    }
}
