//! Every numerical component is a Burn `Module`: the regression network and the Halton
//! multivariate-normal CDF estimator.

pub mod mvn;
pub mod regression;

pub use regression::{RegressionNet, RegressionNetConfig, RegressionOutput};
