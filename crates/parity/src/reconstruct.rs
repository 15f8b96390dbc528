//! Rebuilding missing chunks of a RAID 5 or RAID 6 stripe.
//!
//! Each case of "which chunks are missing" becomes a [`Plan`] first: which chunks to write, which
//! to read, and the GF(2^8) coefficients that turn the survivors into the missing chunks. Planning
//! is pure arithmetic on indices, tested on its own; executing a plan is one pass of one kernel
//! primitive over the survivors, so even the two-missing cases read each surviving chunk once.
//!
//! With P = sum of D_i and Q = sum of g^i * D_i over the data chunks D_0..D_(k-1):
//! - one data chunk x: D_x = P + sum of the other D_i (the RAID 5 rule, also used by RAID 6);
//! - data x and P: D_x = g^-x * (Q + sum over i != x of g^i D_i), and P follows from D_x;
//! - data x and Q: D_x from P as above, and Q = sum over i != x of (g^i + g^x) D_i + g^x P;
//! - data x and y (md's `raid6_2data_recov`): with Pxy = D_x + D_y and Qxy = g^x D_x + g^y D_y
//!   known from the survivors, D_x = (g^y Pxy + Qxy) / (g^x + g^y) and D_y = Pxy + D_x;
//! - P, Q or both: regenerated from the data.
//!
//! Addition is XOR throughout.

use crate::gf;
use crate::{DATA_COUNT_MAX, Kernel, ParityError};

/// How to rebuild the missing chunks of one stripe: indices are into the stripe's chunk list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Nothing is missing.
    Nothing,
    /// `target` = XOR of `sources`.
    Xor { target: usize, sources: Vec<usize> },
    /// Both parity chunks are missing: regenerate P and Q from all the data.
    PqFromData,
    /// `target` = sum over j of `coefs[j][0] * sources[j]`.
    Dot1 { target: usize, sources: Vec<usize>, coefs: Vec<[u8; 1]> },
    /// `targets[r]` = sum over j of `coefs[j][r] * sources[j]`, both in one pass.
    Dot2 { targets: [usize; 2], sources: Vec<usize>, coefs: Vec<[u8; 2]> },
}

/// Checks the stripe shape and missing list and works out how to rebuild; touches no data.
pub(crate) fn plan(
    chunk_count: usize,
    data_count: usize,
    missing: &[usize],
) -> Result<Plan, ParityError> {
    let bad_layout = ParityError::BadLayout { chunk_count, data_count };
    let parity_count = chunk_count.checked_sub(data_count).ok_or(bad_layout.clone())?;
    if !(1..=2).contains(&parity_count) || !(1..=DATA_COUNT_MAX).contains(&data_count) {
        return Err(bad_layout);
    }
    for (position, &index) in missing.iter().enumerate() {
        if index >= chunk_count {
            return Err(ParityError::BadIndex { index, chunk_count });
        }
        if missing[..position].contains(&index) {
            return Err(ParityError::DuplicateIndex { index });
        }
    }
    if missing.len() > parity_count {
        return Err(ParityError::TooManyMissing { missing_count: missing.len(), parity_count });
    }

    let k = data_count;
    let p = k;
    let q = k + 1;
    let data_except =
        |skip: &[usize]| -> Vec<usize> { (0..k).filter(|i| !skip.contains(i)).collect() };
    let with = |mut sources: Vec<usize>, extra: &[usize]| {
        sources.extend_from_slice(extra);
        sources
    };

    let mut sorted = [0usize; 2];
    sorted[..missing.len()].copy_from_slice(missing);
    sorted[..missing.len()].sort_unstable();

    let plan = match (parity_count, &sorted[..missing.len()]) {
        (_, []) => Plan::Nothing,
        (1, &[target]) => {
            Plan::Xor { target, sources: (0..chunk_count).filter(|&i| i != target).collect() }
        }
        (_, &[x]) if x < k => Plan::Xor { target: x, sources: with(data_except(&[x]), &[p]) },
        (_, &[x]) if x == p => Plan::Xor { target: p, sources: data_except(&[]) },
        (_, &[_q]) => {
            let sources = data_except(&[]);
            let coefs = sources.iter().map(|&i| [gf::exp(i)]).collect();
            Plan::Dot1 { target: q, sources, coefs }
        }
        (_, &[x, y]) if y < k => {
            let g_x = gf::exp(x);
            let g_y = gf::exp(y);
            // g^x != g^y because x != y and both are below the generator's order.
            let c2 = gf::inv(g_x ^ g_y);
            let c1 = gf::mul(g_y, c2);
            let sources = with(data_except(&[x, y]), &[p, q]);
            let coefs = sources
                .iter()
                .map(|&i| {
                    let row_x = match i {
                        _ if i == p => c1,
                        _ if i == q => c2,
                        _ => c1 ^ gf::mul(c2, gf::exp(i)),
                    };
                    // D_y = Pxy + D_x, and Pxy's coefficients are 1 on P and the data, 0 on Q.
                    let row_y = if i == q { row_x } else { row_x ^ 1 };
                    [row_x, row_y]
                })
                .collect();
            Plan::Dot2 { targets: [x, y], sources, coefs }
        }
        (_, &[x, y]) if y == p => {
            let g_minus_x = gf::inv(gf::exp(x));
            let sources = with(data_except(&[x]), &[q]);
            let coefs = sources
                .iter()
                .map(|&i| {
                    if i == q {
                        [g_minus_x, g_minus_x]
                    } else {
                        let c = gf::mul(gf::exp(i), g_minus_x);
                        [c, c ^ 1]
                    }
                })
                .collect();
            Plan::Dot2 { targets: [x, p], sources, coefs }
        }
        (_, &[x, _q]) if x < k => {
            let g_x = gf::exp(x);
            let sources = with(data_except(&[x]), &[p]);
            let coefs = sources
                .iter()
                .map(|&i| if i == p { [1, g_x] } else { [1, gf::exp(i) ^ g_x] })
                .collect();
            Plan::Dot2 { targets: [x, q], sources, coefs }
        }
        (_, &[_p, _q]) => Plan::PqFromData,
        (_, _) => unreachable!("at most two missing chunks after the TooManyMissing check"),
    };
    Ok(plan)
}

/// Splits the stripe into the chunks to write (`targets`, in that order) and the chunks to read
/// (`sources`, in that order). The plan never names a chunk twice.
fn split<'a, const R: usize>(
    chunks: &'a mut [&mut [u8]],
    targets: [usize; R],
    sources: &[usize],
) -> ([&'a mut [u8]; R], Vec<&'a [u8]>) {
    let mut slots: Vec<Option<&'a mut [u8]>> = chunks.iter_mut().map(|c| Some(&mut **c)).collect();
    let mut take =
        |index: usize| slots[index].take().expect("a plan names each chunk at most once");
    let targets = targets.map(&mut take);
    let sources = sources.iter().map(|&index| -> &'a [u8] { take(index) }).collect();
    (targets, sources)
}

pub(crate) fn reconstruct(
    kernel: Kernel,
    chunks: &mut [&mut [u8]],
    data_count: usize,
    missing: &[usize],
) -> Result<(), ParityError> {
    let plan = plan(chunks.len(), data_count, missing)?;
    let expected_len = chunks.first().map_or(0, |c| c.len());
    for (index, chunk) in chunks.iter().enumerate() {
        if chunk.len() != expected_len {
            return Err(ParityError::LengthMismatch { index, len: chunk.len(), expected_len });
        }
    }
    match plan {
        Plan::Nothing => {}
        Plan::Xor { target, sources } => {
            let ([dest], sources) = split(chunks, [target], &sources);
            kernel.run_xor_gen(&sources, dest);
        }
        Plan::PqFromData => {
            let k = data_count;
            let ([p, q], data) = split(chunks, [k, k + 1], &(0..k).collect::<Vec<_>>());
            kernel.run_pq_gen(&data, p, q);
        }
        Plan::Dot1 { target, sources, coefs } => {
            let (mut dests, sources) = split(chunks, [target], &sources);
            kernel.run_dot(&coefs, &sources, &mut dests, false);
        }
        Plan::Dot2 { targets, sources, coefs } => {
            let (mut dests, sources) = split(chunks, targets, &sources);
            kernel.run_dot(&coefs, &sources, &mut dests, false);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_rejects_bad_requests_before_touching_data() {
        assert_eq!(plan(5, 4, &[5]), Err(ParityError::BadIndex { index: 5, chunk_count: 5 }));
        assert_eq!(plan(6, 4, &[1, 1]), Err(ParityError::DuplicateIndex { index: 1 }));
        assert_eq!(
            plan(5, 4, &[0, 1]),
            Err(ParityError::TooManyMissing { missing_count: 2, parity_count: 1 })
        );
        assert_eq!(
            plan(6, 4, &[0, 1, 2]),
            Err(ParityError::TooManyMissing { missing_count: 3, parity_count: 2 })
        );
        for (chunk_count, data_count) in [(4, 4), (7, 4), (3, 4), (1, 0), (2, 0)] {
            assert_eq!(
                plan(chunk_count, data_count, &[]),
                Err(ParityError::BadLayout { chunk_count, data_count })
            );
        }
    }

    #[test]
    fn plan_uses_xor_wherever_p_suffices() {
        assert_eq!(plan(5, 4, &[4]), Ok(Plan::Xor { target: 4, sources: vec![0, 1, 2, 3] }));
        assert_eq!(plan(6, 4, &[2]), Ok(Plan::Xor { target: 2, sources: vec![0, 1, 3, 4] }));
        assert_eq!(plan(6, 4, &[4]), Ok(Plan::Xor { target: 4, sources: vec![0, 1, 2, 3] }));
        assert_eq!(plan(6, 4, &[5, 4]), Ok(Plan::PqFromData));
        assert_eq!(plan(6, 4, &[]), Ok(Plan::Nothing));
    }

    #[test]
    fn two_data_plan_is_the_md_raid6_recovery() {
        // md: D_x = A * Pxy + B * Qxy with B = 1 / (g^x + g^y) and A = g^y * B.
        let Ok(Plan::Dot2 { targets, sources, coefs }) = plan(10, 8, &[5, 2]) else {
            panic!("two missing data chunks must plan a two-output dot product");
        };
        assert_eq!(targets, [2, 5]);
        assert_eq!(sources, vec![0, 1, 3, 4, 6, 7, 8, 9]);
        let b = gf::inv(gf::exp(2) ^ gf::exp(5));
        let a = gf::mul(gf::exp(5), b);
        assert_eq!(coefs[6], [a, a ^ 1], "P's coefficients");
        assert_eq!(coefs[7], [b, b], "Q's coefficients");
        assert_eq!(coefs[0], [a ^ b, a ^ b ^ 1], "D0's coefficients (g^0 = 1)");
    }
}
