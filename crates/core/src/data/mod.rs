//! Data: CSV → typed columns, the split (by column, relative window, random or group), normalisation, the prefetching loader, and the
//! dataset builders (baseball, synthetic).

pub mod baseball;
pub mod dataset;
pub mod init;
pub mod loader;
pub mod preprocess;
pub mod split;
#[cfg(test)]
mod split_tests;
pub mod synthetic;
pub mod table;

pub use dataset::{ColumnStats, Dataset, Subset};
pub use table::DataError;
