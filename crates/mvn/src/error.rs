//! The one error type of the multivariate-normal estimator.
//!
//! Every message says what was wrong, where (query index, argument, coordinate or pivot) and
//! what was expected, so that a caller can show it to a user unchanged.

use thiserror::Error;

/// Why a configuration, a query or a pick could not be answered.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum MvnError {
    /// A benchmark fixture (see [`super::bench::load_realistic`]) could not be read or parsed.
    #[error("{path}: {problem}")]
    Fixture {
        /// The file.
        path: String,
        /// What was wrong, with the case and field.
        problem: String,
    },
    /// A configuration field is out of range.
    #[error("invalid estimator config: {field} = {value}; expected {expected}")]
    InvalidConfig {
        /// The config field, e.g. `points`.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: String,
    },

    /// A query has no coordinates.
    #[error("query {query}: the upper limits are empty; expected at least one coordinate")]
    EmptyQuery {
        /// Index of the query in the batch.
        query: usize,
    },

    /// A query has more coordinates than the module was built for.
    #[error(
        "query {query}: dimension {dim} is larger than the module's maximum dimension {max_dim}; \
         build the estimator with max_dim >= {dim}"
    )]
    DimensionTooLarge {
        /// Index of the query in the batch.
        query: usize,
        /// The query's dimension.
        dim: usize,
        /// The module's maximum dimension.
        max_dim: usize,
    },

    /// An argument does not have the shape the others imply.
    #[error("{location}: `{argument}` has {found}; expected {expected}")]
    ShapeMismatch {
        /// `query N` or `batch`.
        location: String,
        /// The argument's name (`upper`, `lower`, `mean`, `cov`, ...).
        argument: &'static str,
        /// The shape or length found.
        found: String,
        /// The shape or length expected.
        expected: String,
    },

    /// A value that must be a number is NaN, or a value that must be finite is infinite.
    #[error("query {query}: {argument}{position} is {value}; expected {expected}")]
    NotFinite {
        /// Index of the query in the batch.
        query: usize,
        /// The argument's name.
        argument: &'static str,
        /// `[i]` or `[i][j]`.
        position: String,
        /// The offending value.
        value: f64,
        /// What is accepted.
        expected: &'static str,
    },

    /// A lower limit lies above its upper limit.
    #[error(
        "query {query}: lower[{index}] = {lower} is above upper[{index}] = {upper}; \
         expected lower <= upper"
    )]
    LowerAboveUpper {
        /// Index of the query in the batch.
        query: usize,
        /// The coordinate.
        index: usize,
        /// The lower limit.
        lower: f64,
        /// The upper limit.
        upper: f64,
    },

    /// The covariance matrix is not symmetric.
    #[error(
        "query {query}: covariance is not symmetric: cov[{row}][{col}] = {a} but \
         cov[{col}][{row}] = {b}; expected equal entries (relative tolerance {tolerance:e})"
    )]
    NotSymmetric {
        /// Index of the query in the batch.
        query: usize,
        /// Row of the first entry.
        row: usize,
        /// Column of the first entry.
        col: usize,
        /// `cov[row][col]`.
        a: f64,
        /// `cov[col][row]`.
        b: f64,
        /// The relative tolerance used.
        tolerance: f64,
    },

    /// A variance on the diagonal is negative.
    #[error(
        "query {query}: covariance has a negative variance cov[{index}][{index}] = {value}; expected >= 0"
    )]
    NegativeVariance {
        /// Index of the query in the batch.
        query: usize,
        /// The coordinate.
        index: usize,
        /// The variance.
        value: f64,
    },

    /// The pivoted Cholesky factorisation met a negative residual variance (or a non-zero
    /// covariance between two variables with zero residual variance): the matrix is not
    /// positive semi-definite.
    #[error(
        "query {query}: covariance is not positive semi-definite: at pivot {pivot} \
         (variable {variable}) {detail}; expected a positive semi-definite matrix"
    )]
    NotPositiveSemiDefinite {
        /// Index of the query in the batch.
        query: usize,
        /// The step of the factorisation (0-based) at which it failed.
        pivot: usize,
        /// The original coordinate index of the variable that failed.
        variable: usize,
        /// What failed, with numbers.
        detail: String,
    },

    /// A pick leg is invalid.
    #[error("leg {leg}: {field} {problem}")]
    InvalidLeg {
        /// Index of the leg.
        leg: usize,
        /// The leg's field (`std`, `mean`, `line`, `target`).
        field: &'static str,
        /// What is wrong and what was expected.
        problem: String,
    },

    /// A correlation matrix given for picks is invalid.
    #[error("{which} correlation: {problem}")]
    InvalidCorrelation {
        /// `target` or `cross-row`.
        which: &'static str,
        /// What is wrong and what was expected.
        problem: String,
    },

    /// The tensor backend failed (e.g. reading a tensor back from the device).
    #[error("tensor backend error while {context}: {message}")]
    Backend {
        /// What was being done.
        context: &'static str,
        /// The backend's message.
        message: String,
    },
}

impl MvnError {
    /// The same error with its query index mapped through `f` (used when a batch is split
    /// into groups and a group-local index must become the caller's index).
    pub fn map_query(self, f: impl Fn(usize) -> usize) -> Self {
        use MvnError::*;
        match self {
            EmptyQuery { query } => EmptyQuery { query: f(query) },
            DimensionTooLarge {
                query,
                dim,
                max_dim,
            } => DimensionTooLarge {
                query: f(query),
                dim,
                max_dim,
            },
            NotFinite {
                query,
                argument,
                position,
                value,
                expected,
            } => NotFinite {
                query: f(query),
                argument,
                position,
                value,
                expected,
            },
            LowerAboveUpper {
                query,
                index,
                lower,
                upper,
            } => LowerAboveUpper {
                query: f(query),
                index,
                lower,
                upper,
            },
            NotSymmetric {
                query,
                row,
                col,
                a,
                b,
                tolerance,
            } => NotSymmetric {
                query: f(query),
                row,
                col,
                a,
                b,
                tolerance,
            },
            NegativeVariance {
                query,
                index,
                value,
            } => NegativeVariance {
                query: f(query),
                index,
                value,
            },
            NotPositiveSemiDefinite {
                query,
                pivot,
                variable,
                detail,
            } => NotPositiveSemiDefinite {
                query: f(query),
                pivot,
                variable,
                detail,
            },
            other => other,
        }
    }

    /// A shape mismatch for query `query`.
    pub(crate) fn shape(
        query: usize,
        argument: &'static str,
        found: impl Into<String>,
        expected: impl Into<String>,
    ) -> Self {
        MvnError::ShapeMismatch {
            location: format!("query {query}"),
            argument,
            found: found.into(),
            expected: expected.into(),
        }
    }

    /// A shape mismatch for a whole batch.
    pub(crate) fn batch_shape(
        argument: &'static str,
        found: impl Into<String>,
        expected: impl Into<String>,
    ) -> Self {
        MvnError::ShapeMismatch {
            location: "batch".to_string(),
            argument,
            found: found.into(),
            expected: expected.into(),
        }
    }
}
