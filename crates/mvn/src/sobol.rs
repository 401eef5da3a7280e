//! The randomised Sobol' point sets, the alternative to the Halton sets
//! ([`crate::PointSet::Sobol`]).
//!
//! Coordinate j of point i is the base-2 digital sequence of Sobol' (1967) with the direction
//! numbers of Joe & Kuo (2008, the `new-joe-kuo-6.21201` set, as SciPy ships it), in Gray-code
//! order (Antonov & Saleev 1979): point i is the XOR of the direction numbers of the bits that
//! change from Gray(i − 1) to Gray(i). Each randomisation scrambles every coordinate with its
//! own random linear matrix scrambling and digital shift (Matoušek 1998), as the Halton sets
//! are scrambled, here in base 2: output bit k is (Σ_{l≤k} M_kl x_l + c_k) mod 2 with M lower
//! triangular with a unit diagonal. The scrambling is linear, so it is applied once to the
//! direction numbers and the points stay XORs of them.
//!
//! Why a second point set: all coordinates share base 2, so the first 2^m points form a
//! (t, m, s)-net, and scrambled nets integrate smooth integrands with an RMS error falling
//! like n^−3/2 (up to logarithms; Owen 1997, and Owen 2003 for this scrambling) rather than the
//! n^−1 the scrambled Halton sets reach on Genz's integrand. The adaptive mode therefore grows
//! a Sobol' query's points in powers of two (see `cpu`), where the nets are.

use super::halton::SplitMix64;

/// Bits of each coordinate (the points are stored as f32, which keeps the top 24).
const BITS: usize = 32;

/// Coordinates the direction numbers cover (the Halton sets' limit, [`super::halton::MAX_HALTON_DIM`]).
pub const MAX_SOBOL_DIM: usize = 128;

/// Joe & Kuo's primitive polynomial and initial direction numbers m_1..m_s of coordinates
/// 2..=128 (coordinate 1 is the van der Corput sequence): the polynomial
/// x^s + a_1 x^(s−1) + … + a_(s−1) x + 1 is written as the integer with bits s, s − i (for
/// a_i) and 0.
static DIRECTIONS: [(u32, &[u32]); MAX_SOBOL_DIM - 1] = [
    (3, &[1]),
    (7, &[1, 3]),
    (11, &[1, 3, 1]),
    (13, &[1, 1, 1]),
    (19, &[1, 1, 3, 3]),
    (25, &[1, 3, 5, 13]),
    (37, &[1, 1, 5, 5, 17]),
    (41, &[1, 1, 5, 5, 5]),
    (47, &[1, 1, 7, 11, 19]),
    (55, &[1, 1, 5, 1, 1]),
    (59, &[1, 1, 1, 3, 11]),
    (61, &[1, 3, 5, 5, 31]),
    (67, &[1, 3, 3, 9, 7, 49]),
    (91, &[1, 1, 1, 15, 21, 21]),
    (97, &[1, 3, 1, 13, 27, 49]),
    (103, &[1, 1, 1, 15, 7, 5]),
    (109, &[1, 3, 1, 15, 13, 25]),
    (115, &[1, 1, 5, 5, 19, 61]),
    (131, &[1, 3, 7, 11, 23, 15, 103]),
    (137, &[1, 3, 7, 13, 13, 15, 69]),
    (143, &[1, 1, 3, 13, 7, 35, 63]),
    (145, &[1, 3, 5, 9, 1, 25, 53]),
    (157, &[1, 3, 1, 13, 9, 35, 107]),
    (167, &[1, 3, 1, 5, 27, 61, 31]),
    (171, &[1, 1, 5, 11, 19, 41, 61]),
    (185, &[1, 3, 5, 3, 3, 13, 69]),
    (191, &[1, 1, 7, 13, 1, 19, 1]),
    (193, &[1, 3, 7, 5, 13, 19, 59]),
    (203, &[1, 1, 3, 9, 25, 29, 41]),
    (211, &[1, 3, 5, 13, 23, 1, 55]),
    (213, &[1, 3, 7, 3, 13, 59, 17]),
    (229, &[1, 3, 1, 3, 5, 53, 69]),
    (239, &[1, 1, 5, 5, 23, 33, 13]),
    (241, &[1, 1, 7, 7, 1, 61, 123]),
    (247, &[1, 1, 7, 9, 13, 61, 49]),
    (253, &[1, 3, 3, 5, 3, 55, 33]),
    (285, &[1, 3, 1, 15, 31, 13, 49, 245]),
    (299, &[1, 3, 5, 15, 31, 59, 63, 97]),
    (301, &[1, 3, 1, 11, 11, 11, 77, 249]),
    (333, &[1, 3, 1, 11, 27, 43, 71, 9]),
    (351, &[1, 1, 7, 15, 21, 11, 81, 45]),
    (355, &[1, 3, 7, 3, 25, 31, 65, 79]),
    (357, &[1, 3, 1, 1, 19, 11, 3, 205]),
    (361, &[1, 1, 5, 9, 19, 21, 29, 157]),
    (369, &[1, 3, 7, 11, 1, 33, 89, 185]),
    (391, &[1, 3, 3, 3, 15, 9, 79, 71]),
    (397, &[1, 3, 7, 11, 15, 39, 119, 27]),
    (425, &[1, 1, 3, 1, 11, 31, 97, 225]),
    (451, &[1, 1, 1, 3, 23, 43, 57, 177]),
    (463, &[1, 3, 7, 7, 17, 17, 37, 71]),
    (487, &[1, 3, 1, 5, 27, 63, 123, 213]),
    (501, &[1, 1, 3, 5, 11, 43, 53, 133]),
    (529, &[1, 3, 5, 5, 29, 17, 47, 173, 479]),
    (539, &[1, 3, 3, 11, 3, 1, 109, 9, 69]),
    (545, &[1, 1, 1, 5, 17, 39, 23, 5, 343]),
    (557, &[1, 3, 1, 5, 25, 15, 31, 103, 499]),
    (563, &[1, 1, 1, 11, 11, 17, 63, 105, 183]),
    (601, &[1, 1, 5, 11, 9, 29, 97, 231, 363]),
    (607, &[1, 1, 5, 15, 19, 45, 41, 7, 383]),
    (617, &[1, 3, 7, 7, 31, 19, 83, 137, 221]),
    (623, &[1, 1, 1, 3, 23, 15, 111, 223, 83]),
    (631, &[1, 1, 5, 13, 31, 15, 55, 25, 161]),
    (637, &[1, 1, 3, 13, 25, 47, 39, 87, 257]),
    (647, &[1, 1, 1, 11, 21, 53, 125, 249, 293]),
    (661, &[1, 1, 7, 11, 11, 7, 57, 79, 323]),
    (675, &[1, 1, 5, 5, 17, 13, 81, 3, 131]),
    (677, &[1, 1, 7, 13, 23, 7, 65, 251, 475]),
    (687, &[1, 3, 5, 1, 9, 43, 3, 149, 11]),
    (695, &[1, 1, 3, 13, 31, 13, 13, 255, 487]),
    (701, &[1, 3, 3, 1, 5, 63, 89, 91, 127]),
    (719, &[1, 1, 3, 3, 1, 19, 123, 127, 237]),
    (721, &[1, 1, 5, 7, 23, 31, 37, 243, 289]),
    (731, &[1, 1, 5, 11, 17, 53, 117, 183, 491]),
    (757, &[1, 1, 1, 5, 1, 13, 13, 209, 345]),
    (761, &[1, 1, 3, 15, 1, 57, 115, 7, 33]),
    (787, &[1, 3, 1, 11, 7, 43, 81, 207, 175]),
    (789, &[1, 3, 1, 1, 15, 27, 63, 255, 49]),
    (799, &[1, 3, 5, 3, 27, 61, 105, 171, 305]),
    (803, &[1, 1, 5, 3, 1, 3, 57, 249, 149]),
    (817, &[1, 1, 3, 5, 5, 57, 15, 13, 159]),
    (827, &[1, 1, 1, 11, 7, 11, 105, 141, 225]),
    (847, &[1, 3, 3, 5, 27, 59, 121, 101, 271]),
    (859, &[1, 3, 5, 9, 11, 49, 51, 59, 115]),
    (865, &[1, 1, 7, 1, 23, 45, 125, 71, 419]),
    (875, &[1, 1, 3, 5, 23, 5, 105, 109, 75]),
    (877, &[1, 1, 7, 15, 7, 11, 67, 121, 453]),
    (883, &[1, 3, 7, 3, 9, 13, 31, 27, 449]),
    (895, &[1, 3, 1, 15, 19, 39, 39, 89, 15]),
    (901, &[1, 1, 1, 1, 1, 33, 73, 145, 379]),
    (911, &[1, 3, 1, 15, 15, 43, 29, 13, 483]),
    (949, &[1, 1, 7, 3, 19, 27, 85, 131, 431]),
    (953, &[1, 3, 3, 3, 5, 35, 23, 195, 349]),
    (967, &[1, 3, 3, 7, 9, 27, 39, 59, 297]),
    (971, &[1, 1, 3, 9, 11, 17, 13, 241, 157]),
    (973, &[1, 3, 7, 15, 25, 57, 33, 189, 213]),
    (981, &[1, 1, 7, 1, 9, 55, 73, 83, 217]),
    (985, &[1, 3, 3, 13, 19, 27, 23, 113, 249]),
    (995, &[1, 3, 5, 3, 23, 43, 3, 253, 479]),
    (1001, &[1, 1, 5, 5, 11, 5, 45, 117, 217]),
    (1019, &[1, 3, 3, 7, 29, 37, 33, 123, 147]),
    (1033, &[1, 3, 1, 15, 5, 5, 37, 227, 223, 459]),
    (1051, &[1, 1, 7, 5, 5, 39, 63, 255, 135, 487]),
    (1063, &[1, 3, 1, 7, 9, 7, 87, 249, 217, 599]),
    (1069, &[1, 1, 3, 13, 9, 47, 7, 225, 363, 247]),
    (1125, &[1, 3, 7, 13, 19, 13, 9, 67, 9, 737]),
    (1135, &[1, 3, 5, 5, 19, 59, 7, 41, 319, 677]),
    (1153, &[1, 1, 5, 3, 31, 63, 15, 43, 207, 789]),
    (1163, &[1, 1, 7, 9, 13, 39, 3, 47, 497, 169]),
    (1221, &[1, 3, 1, 7, 21, 17, 97, 19, 415, 905]),
    (1239, &[1, 3, 7, 1, 3, 31, 71, 111, 165, 127]),
    (1255, &[1, 1, 5, 11, 1, 61, 83, 119, 203, 847]),
    (1267, &[1, 3, 3, 13, 9, 61, 19, 97, 47, 35]),
    (1279, &[1, 1, 7, 7, 15, 29, 63, 95, 417, 469]),
    (1293, &[1, 3, 1, 9, 25, 9, 71, 57, 213, 385]),
    (1305, &[1, 3, 5, 13, 31, 47, 101, 57, 39, 341]),
    (1315, &[1, 1, 3, 3, 31, 57, 125, 173, 365, 551]),
    (1329, &[1, 3, 7, 1, 13, 57, 67, 157, 451, 707]),
    (1341, &[1, 1, 1, 7, 21, 13, 105, 89, 429, 965]),
    (1347, &[1, 1, 5, 9, 17, 51, 45, 119, 157, 141]),
    (1367, &[1, 3, 7, 7, 13, 45, 91, 9, 129, 741]),
    (1387, &[1, 3, 7, 1, 23, 57, 67, 141, 151, 571]),
    (1413, &[1, 1, 3, 11, 17, 47, 93, 107, 375, 157]),
    (1423, &[1, 3, 3, 5, 11, 21, 43, 51, 169, 915]),
    (1431, &[1, 1, 5, 3, 15, 55, 101, 67, 455, 625]),
    (1441, &[1, 3, 5, 9, 1, 23, 29, 47, 345, 595]),
    (1479, &[1, 3, 7, 7, 5, 49, 29, 155, 323, 589]),
    (1509, &[1, 3, 3, 7, 5, 41, 127, 61, 261, 717]),
];

/// The 32 direction numbers of coordinate `j` (0-based), as 32-bit fractions (bit 31 is the
/// first binary digit).
fn direction_numbers(j: usize) -> [u32; BITS] {
    let mut v = [0u32; BITS];
    if j == 0 {
        for (k, vk) in v.iter_mut().enumerate() {
            *vk = 1 << (BITS - 1 - k);
        }
        return v;
    }
    let (poly, init) = DIRECTIONS[j - 1];
    let s = init.len();
    // m_k (odd, below 2^(k+1)) by the recurrence
    // m_k = 2 a_1 m_(k−1) ⊕ 4 a_2 m_(k−2) ⊕ … ⊕ 2^(s−1) a_(s−1) m_(k−s+1) ⊕ 2^s m_(k−s) ⊕ m_(k−s).
    let mut m = [0u64; BITS];
    for k in 0..BITS {
        m[k] = if k < s {
            init[k] as u64
        } else {
            let mut next = m[k - s] ^ (m[k - s] << s);
            for i in 1..s {
                if (poly >> (s - i)) & 1 == 1 {
                    next ^= m[k - i] << i;
                }
            }
            next
        };
    }
    for k in 0..BITS {
        v[k] = (m[k] << (BITS - 1 - k)) as u32;
    }
    v
}

/// M·x for the lower-triangular scrambling matrix whose row k (output bit k, counted from the
/// most significant) is `rows[k]`.
fn scramble(rows: &[u32; BITS], x: u32) -> u32 {
    let mut out = 0u32;
    for (k, &row) in rows.iter().enumerate() {
        out |= ((row & x).count_ones() & 1) << (BITS - 1 - k);
    }
    out
}

/// `n` points of one randomised (linearly scrambled, digitally shifted) Sobol' set in `dim`
/// coordinates, row-major (`n × dim`), every coordinate in [0, 1). `dim` must be at most
/// [`MAX_SOBOL_DIM`]; `scramble_points` false gives the plain sequence (for tests).
pub fn scrambled_sobol(
    n: usize,
    dim: usize,
    rng: &mut SplitMix64,
    scramble_points: bool,
) -> Vec<f64> {
    assert!(
        dim <= MAX_SOBOL_DIM,
        "Sobol' sets cover at most {MAX_SOBOL_DIM} coordinates"
    );
    let mut out = vec![0.0; n * dim];
    let scale = 1.0 / (1u64 << BITS) as f64;
    for j in 0..dim {
        let mut v = direction_numbers(j);
        let mut shift = 0u32;
        if scramble_points {
            // Row k: the diagonal bit, and random bits for the k more significant digits.
            let mut rows = [0u32; BITS];
            for (k, row) in rows.iter_mut().enumerate() {
                let diagonal = 1u32 << (BITS - 1 - k);
                let above = !((diagonal as u64) * 2 - 1) as u32;
                *row = diagonal | (rng.next_u64() as u32 & above);
            }
            shift = rng.next_u64() as u32;
            for vk in v.iter_mut() {
                *vk = scramble(&rows, *vk);
            }
        }
        let mut x = 0u32;
        for i in 0..n {
            if i > 0 {
                x ^= v[(i as u64).trailing_zeros() as usize];
            }
            out[i * dim + j] = ((x ^ shift) as f64 * scale).min(1.0 - f64::EPSILON);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_sequence_is_sobols_with_joe_kuo_numbers() {
        // SciPy 1.17.1: qmc.Sobol(6, scramble=False).random_base2(3).
        let want = [
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
            [0.75, 0.25, 0.25, 0.25, 0.75, 0.75],
            [0.25, 0.75, 0.75, 0.75, 0.25, 0.25],
            [0.375, 0.375, 0.625, 0.875, 0.375, 0.125],
            [0.875, 0.875, 0.125, 0.375, 0.875, 0.625],
            [0.625, 0.125, 0.875, 0.625, 0.625, 0.875],
            [0.125, 0.625, 0.375, 0.125, 0.125, 0.375],
        ];
        let pts = scrambled_sobol(8, 6, &mut SplitMix64::new(1), false);
        for (i, row) in want.iter().enumerate() {
            assert_eq!(&pts[i * 6..i * 6 + 6], row, "point {i}");
        }
        // Far coordinates and later points (qmc.Sobol(128, scramble=False).random_base2(10)).
        let pts = scrambled_sobol(1024, 128, &mut SplitMix64::new(1), false);
        let far = [
            0.72363281, 0.55761719, 0.15332031, 0.89355469, 0.61035156, 0.58105469, 0.57519531,
            0.70019531,
        ];
        for (k, w) in far.iter().enumerate() {
            assert!(
                (pts[1023 * 128 + 120 + k] - w).abs() < 1e-8,
                "point 1023, coordinate {}",
                120 + k
            );
        }
        for (j, w) in [
            (0, 0.69238281),
            (1, 0.93652344),
            (2, 0.16308594),
            (50, 0.08300781),
            (127, 0.11816406),
        ] {
            assert!(
                (pts[777 * 128 + j] - w).abs() < 1e-8,
                "point 777, coordinate {j}"
            );
        }
    }

    #[test]
    fn scrambled_points_keep_the_net_property() {
        // The first 2^m points of coordinates 1 and 2 form a (0, m, 2)-net in base 2: every
        // dyadic box of area 2^−m holds exactly one point, scrambled or not.
        let m = 10;
        let n = 1 << m;
        for scrambled in [false, true] {
            let pts = scrambled_sobol(n, 3, &mut SplitMix64::new(5), scrambled);
            assert!(pts.iter().all(|&v| (0.0..1.0).contains(&v)));
            for k in 0..=m {
                let (cx, cy) = (1usize << k, 1usize << (m - k));
                let mut seen = vec![false; n];
                for i in 0..n {
                    let x = (pts[i * 3] * cx as f64) as usize;
                    let y = (pts[i * 3 + 1] * cy as f64) as usize;
                    assert!(
                        !seen[x * cy + y],
                        "box {x},{y} of {cx}x{cy} twice (scrambled {scrambled})"
                    );
                    seen[x * cy + y] = true;
                }
            }
        }
    }

    #[test]
    fn a_scrambled_point_is_uniform_and_seeds_differ() {
        let mut rng = SplitMix64::new(3);
        let draws: Vec<f64> = (0..4000)
            .map(|_| scrambled_sobol(6, 3, &mut rng, true)[5 * 3 + 2])
            .collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        let var = draws.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.015, "mean {mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.006, "variance {var}");
        let a = scrambled_sobol(64, 3, &mut SplitMix64::new(1), true);
        assert_eq!(a, scrambled_sobol(64, 3, &mut SplitMix64::new(1), true));
        assert_ne!(a, scrambled_sobol(64, 3, &mut SplitMix64::new(2), true));
    }
}
