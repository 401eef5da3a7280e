//! Data: CSV and Parquet → typed columns, the split (by column, relative window, random or group), normalisation, the prefetching loader, and the
//! dataset builders (baseball, synthetic).

pub mod baseball;
pub mod column;
pub mod dataset;
pub mod dates;
pub use kiln_model::drift;
pub mod init;
pub mod loader;
#[cfg(feature = "parquet")]
pub mod parquet;
#[cfg(not(feature = "parquet"))]
pub mod parquet {
    //! Without the `parquet` feature: Parquet files are recognised and refused.
    /// Whether `bytes` start like a Parquet file (`PAR1`).
    pub fn is_parquet(bytes: &[u8]) -> bool {
        bytes.len() >= 8 && bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1")
    }
    /// The header and columns of a Parquet file.
    pub type Cells = (Vec<String>, Vec<super::table::Column>);
    /// Refuse: this build has no Parquet reader.
    pub fn read(_bytes: Vec<u8>) -> Result<Cells, String> {
        Err("this build of kiln-core has no Parquet reader (cargo feature `parquet`; the kiln binary has it)".into())
    }
    /// Refuse: this build has no Parquet reader.
    pub fn read_with(bytes: Vec<u8>, _limits: &super::table::ReadLimits) -> Result<Cells, String> {
        read(bytes)
    }
    /// Refuse: this build has no Parquet reader.
    pub fn read_file(
        _file: std::fs::File,
        _limits: &super::table::ReadLimits,
    ) -> Result<Cells, String> {
        read(Vec::new())
    }
    /// The header, the columns and, per column, whether it was read.
    pub type ProjectedCells = (Vec<String>, Vec<super::table::Column>, Vec<bool>);
    /// Refuse: this build has no Parquet reader.
    pub fn read_file_columns(
        _file: std::fs::File,
        _limits: &super::table::ReadLimits,
        _keep: super::column::Projection<'_>,
    ) -> Result<ProjectedCells, String> {
        Err(read(Vec::new()).unwrap_err())
    }
}
pub mod preprocess;
pub mod split;
#[cfg(test)]
mod split_tests;
pub mod synthetic;
pub mod table;

pub use dataset::{ColumnStats, Dataset, Subset};
pub use table::DataError;
