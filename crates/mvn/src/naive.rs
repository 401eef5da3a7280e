//! The naive (direct) Halton estimator on the CPU: z = Φ⁻¹(u) = √2·erfinv(2u − 1) over the
//! scrambled Halton points (precomputed once, they do not depend on the query), x = L z, and
//! the fraction of points with a ≤ x ≤ b. L is the same pivoted factor the Genz method uses
//! (any square root of the covariance gives the same distribution of x).

use super::cholesky::Factor;
use super::constants::HostConstants;
use super::normal::{BLOCK, madd};

/// Number of points of randomisation `r`, among `start..end` (multiples of [`BLOCK`]; points
/// at or past n do not count), that fall inside the box.
pub(crate) fn naive_count(
    f: &Factor,
    host: &HostConstants,
    r: usize,
    start: usize,
    end: usize,
) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA, checked just above.
            return unsafe { naive_count_avx2(f, host, r, start, end) };
        }
    }
    naive_count_generic::<false>(f, host, r, start, end)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn naive_count_avx2(f: &Factor, host: &HostConstants, r: usize, start: usize, end: usize) -> f64 {
    naive_count_generic::<true>(f, host, r, start, end)
}

#[inline(always)]
fn naive_count_generic<const FMA: bool>(
    f: &Factor,
    host: &HostConstants,
    r: usize,
    start: usize,
    end: usize,
) -> f64 {
    let d = f.d;
    let mut count = 0.0;
    let mut base = start;
    let mut x = [0.0f64; BLOCK];
    while base < end {
        let mut inside = [true; BLOCK];
        for i in 0..d {
            x.fill(0.0);
            for k in 0..(i + 1).min(f.random) {
                let lik = f.l[i * d + k];
                let Some(z) = host.z(r, k) else { return 0.0 };
                let z = &z[base..base + BLOCK];
                for lane in 0..BLOCK {
                    x[lane] = madd::<FMA>(lik, z[lane], x[lane]);
                }
            }
            let (a, b) = (f.a[i], f.b[i]);
            for lane in 0..BLOCK {
                inside[lane] &= x[lane] >= a && x[lane] <= b;
            }
        }
        let live = host.n.saturating_sub(base).min(BLOCK);
        count += inside[..live].iter().filter(|&&v| v).count() as f64;
        base += BLOCK;
    }
    count
}
