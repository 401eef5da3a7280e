//! Data: CSV → typed columns, season split, normalisation, the prefetching loader, and the
//! dataset builders (baseball, synthetic).

pub mod baseball;
pub mod dataset;
pub mod loader;
pub mod synthetic;
pub mod table;

pub use dataset::{ColumnStats, Dataset, Subset};
pub use table::DataError;
