//! Every numerical component is a Burn `Module`: the regression network and the Halton
//! multivariate-normal CDF estimator.

/// The multivariate-normal CDF estimator (the `kiln-mvn` crate).
pub use kiln_mvn as mvn;
pub mod fused_linear;
pub mod regression;

pub use regression::{
    Activation, MemberOutput, RegressionNet, RegressionNetConfig, RegressionOutput,
};
