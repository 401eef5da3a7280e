//! Halton multivariate-normal CDF estimator (see issue 3).
