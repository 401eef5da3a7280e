//! kiln's leaves, which import nothing of kiln's: the SIMD tokens and vector types ([`simd`]),
//! the seedable random number generator every random stream derives from ([`rng`]), and the
//! small helpers every layer uses once ([`util`]: atomic files, UTC time, host and process facts,
//! hashing, percentiles, the crash-test hook).

#![warn(missing_docs)]

pub mod rng;
pub mod simd;
pub mod util;
