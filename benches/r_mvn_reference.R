# R mvtnorm's pmvnorm on the realistic MVN families (benches/mvn_realistic.json), the anchor
# beside SciPy for `kiln bench mvn --realistic` (issue 29).
#
#   Rscript benches/r_mvn_reference.R [--fixture F] [--d 2,4,8,12,16] [--rounds 3]
#                                     [--algorithm default|tight]
#
# Needs Debian's r-cran-mvtnorm and r-cran-jsonlite. `default` is pmvnorm's own default,
# GenzBretz(maxpts = 25000, abseps = 0.001, releps = 0); `tight` is
# GenzBretz(maxpts = 1e6, abseps = 1e-6). Every query of each dimension is answered once per
# round, each call timed alone (the R call included: it is what an R user pays); a query's
# time is its median over rounds. The error of the first round's answer against the fixture's
# high-accuracy reference is reported as max and RMS. One JSON line per dimension.
suppressPackageStartupMessages({
  library(mvtnorm)
  library(jsonlite)
})

args <- commandArgs(trailingOnly = TRUE)
opt <- list(fixture = "benches/mvn_realistic.json", d = "2,4,8,12,16", rounds = "3",
            algorithm = "default", seed = "1")  # --seed: pmvnorm's RNG (seed·1000 + d)
i <- 1
while (i <= length(args)) {
  key <- sub("^--", "", args[i])
  if (!(key %in% names(opt)) || i == length(args)) {
    stop(sprintf("unknown or valueless argument `%s`; expected one of --%s VALUE", args[i],
                 paste(names(opt), collapse = ", --")))
  }
  opt[[key]] <- args[i + 1]
  i <- i + 2
}

algorithm <- switch(opt$algorithm,
  default = GenzBretz(),
  tight = GenzBretz(maxpts = 1e6, abseps = 1e-6),
  stop(sprintf("--algorithm `%s`: expected default or tight", opt$algorithm)))
rounds <- max(1L, as.integer(opt$rounds))
dims <- as.integer(strsplit(opt$d, ",")[[1]])

fixture <- fromJSON(opt$fixture, simplifyVector = FALSE)
# A one-factor case stores its loadings λ: corr = λλᵀ with a unit diagonal.
corr_of <- function(c) {
  if (!is.null(c$loadings)) {
    lam <- as.numeric(unlist(c$loadings))
    m <- outer(lam, lam)
    diag(m) <- 1
    return(m)
  }
  matrix(as.numeric(unlist(c$corr)), c$d, c$d, byrow = TRUE)
}
limit <- function(v, inf) vapply(v, function(x) if (is.null(x)) inf else as.numeric(x), 0)

for (d in dims) {
  sel <- Filter(function(c) c$d == d, fixture$cases)
  if (length(sel) == 0) next
  # Seeded per dimension, so that a dimension's answers do not depend on which others ran.
  set.seed(as.integer(opt$seed) * 1000L + d)
  qs <- lapply(sel, function(c) list(
    lower = limit(c$lower, -Inf),
    upper = limit(c$upper, Inf),
    corr = corr_of(c),
    reference = c$reference))
  times <- matrix(0, length(qs), rounds)
  err <- numeric(length(qs))
  for (r in seq_len(rounds)) {
    for (k in seq_along(qs)) {
      q <- qs[[k]]
      t0 <- Sys.time()
      p <- pmvnorm(lower = q$lower, upper = q$upper, corr = q$corr, algorithm = algorithm)
      times[k, r] <- as.numeric(difftime(Sys.time(), t0, units = "secs")) * 1e3
      if (r == 1) err[k] <- abs(as.numeric(p) - q$reference)
    }
  }
  ms <- apply(times, 1, median)
  cat(toJSON(list(
    bench = "r-mvtnorm", mvtnorm = as.character(packageVersion("mvtnorm")),
    r = paste(R.version$major, R.version$minor, sep = "."), algorithm = opt$algorithm,
    d = d, queries = length(qs), rounds = rounds,
    ms_per_query_mean = mean(ms), ms_p50 = unname(quantile(ms, 0.5)),
    ms_p99 = unname(quantile(ms, 0.99)), max_abs_err = max(err),
    rms_err = sqrt(mean(err^2))), auto_unbox = TRUE, digits = I(6)), "\n", sep = "")
}
