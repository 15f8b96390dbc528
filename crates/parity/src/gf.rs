//! Arithmetic in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and generator 2:
//! the field Linux md and ISA-L use for RAID 6 Q parity. Changing either constant changes every Q
//! block ever written, so both are part of the on-disk format.
//!
//! The tables the SIMD kernels need (nibble-product tables for `vpshufb`, bit matrices for
//! `gf2p8affine`) are computed here at compile time from the same definition of multiplication.

/// The reducing polynomial, with its x^8 term.
pub const POLYNOMIAL: u16 = 0x11d;
/// The generator whose powers weight the data chunks in Q.
pub const GENERATOR: u8 = 2;
/// Number of non-zero field elements, and the order of the generator: g^255 = 1.
pub const ORDER: usize = 255;

/// Multiplication by shift-and-add, used only to build the tables and as the tests' model.
const fn mul_slow(a: u8, b: u8) -> u8 {
    let mut a = a as u16;
    let mut b = b;
    let mut product: u16 = 0;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        a <<= 1;
        if a & 0x100 != 0 {
            a ^= POLYNOMIAL;
        }
        b >>= 1;
    }
    product as u8
}

/// `EXP[i] = g^i`, stored twice over so `EXP[log a + log b]` never needs a modulo.
static EXP: [u8; 2 * ORDER] = {
    let mut table = [0u8; 2 * ORDER];
    let mut value: u8 = 1;
    let mut i = 0;
    while i < 2 * ORDER {
        table[i] = value;
        value = mul_slow(value, GENERATOR);
        i += 1;
    }
    table
};

/// `LOG[a]` is the i with g^i = a; `LOG[0]` is meaningless and never read.
static LOG: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut value: u8 = 1;
    let mut i = 0;
    while i < ORDER {
        table[value as usize] = i as u8;
        value = mul_slow(value, GENERATOR);
        i += 1;
    }
    table
};

/// The product `a * b` in the field.
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
}

/// The multiplicative inverse of `a`.
///
/// # Panics
/// If `a` is 0, which has no inverse; asking for it is a bug in the caller.
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "gf::inv(0): zero has no inverse in GF(2^8)");
    EXP[ORDER - LOG[a as usize] as usize]
}

/// `g^i`, the Q coefficient of data chunk `i` (exponents wrap modulo 255).
pub fn exp(i: usize) -> u8 {
    EXP[i % ORDER]
}

/// The discrete logarithm: the i in `0..255` with `exp(i) == a`.
///
/// # Panics
/// If `a` is 0, which is no power of the generator.
pub fn log(a: u8) -> usize {
    assert!(a != 0, "gf::log(0): zero is no power of the generator");
    LOG[a as usize] as usize
}

/// The 8x8 bit matrix that makes `gf2p8affine(x, matrix, 0)` compute `c * x` in this field.
///
/// The instruction forms output bit `b` as the parity of `x AND matrix.byte[7 - b]`, so byte
/// `7 - b` of the matrix holds, at bit `j`, bit `b` of `c * 2^j` (multiplication distributes over
/// the bits of x). This is how a field with any polynomial runs on GFNI, whose own multiply
/// instruction is fixed to AES's 0x11b.
const fn affine_matrix(c: u8) -> u64 {
    let mut matrix: u64 = 0;
    let mut bit_out = 0;
    while bit_out < 8 {
        let mut row: u64 = 0;
        let mut bit_in = 0;
        while bit_in < 8 {
            let column = mul_slow(c, 1 << bit_in);
            row |= (((column >> bit_out) & 1) as u64) << bit_in;
            bit_in += 1;
        }
        matrix |= row << (8 * (7 - bit_out));
        bit_out += 1;
    }
    matrix
}

/// `AFFINE_MATRIX[c]`: the `gf2p8affine` matrix multiplying by `c`.
pub(crate) static AFFINE_MATRIX: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = affine_matrix(c as u8);
        c += 1;
    }
    table
};

/// `POWER_MATRIX[i]`: the `gf2p8affine` matrix multiplying by g^i, data chunk i's Q weight.
pub(crate) static POWER_MATRIX: [u64; ORDER] = {
    let mut table = [0u64; ORDER];
    let mut power: u8 = 1;
    let mut i = 0;
    while i < ORDER {
        table[i] = affine_matrix(power);
        power = mul_slow(power, GENERATOR);
        i += 1;
    }
    table
};

/// `NIBBLE_PRODUCTS[c]`: bytes 0..16 hold `c * n` and bytes 16..32 hold `c * (n << 4)` for
/// `n` in 0..16, so `c * x = low[x & 15] ^ high[x >> 4]`: one `vpshufb` per half on AVX2, two
/// table reads per byte in the scalar kernel.
pub(crate) static NIBBLE_PRODUCTS: [[u8; 32]; 256] = {
    let mut table = [[0u8; 32]; 256];
    let mut c = 0;
    while c < 256 {
        let mut n = 0;
        while n < 16 {
            table[c][n] = mul_slow(c as u8, n as u8);
            table[c][16 + n] = mul_slow(c as u8, (n as u8) << 4);
            n += 1;
        }
        c += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Software model of the `gf2p8affine` instruction on one byte, with a zero constant.
    fn affine_byte(matrix: u64, x: u8) -> u8 {
        let mut out = 0u8;
        for bit_out in 0..8 {
            let row = (matrix >> (8 * (7 - bit_out))) as u8;
            out |= (((row & x).count_ones() & 1) as u8) << bit_out;
        }
        out
    }

    #[test]
    fn mul_matches_shift_and_add_for_every_pair() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_slow(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn every_nonzero_element_times_its_inverse_is_one() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1, "a = {a}");
            assert_eq!(inv(inv(a)), a);
        }
    }

    #[test]
    fn mul_is_commutative_associative_and_distributes_over_xor() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let [a, b, c, ..] = state.to_le_bytes();
            assert_eq!(mul(a, b ^ c), mul(a, b) ^ mul(a, c), "{a} {b} {c}");
            assert_eq!(mul(a, b), mul(b, a));
            assert_eq!(mul(mul(a, b), c), mul(a, mul(b, c)));
        }
    }

    #[test]
    fn generator_has_order_255_and_exp_is_repeated_doubling() {
        assert_eq!(exp(0), 1);
        assert_eq!(exp(255), 1);
        let mut power = 1u8;
        let mut seen = [false; 256];
        for i in 0..ORDER {
            assert_eq!(exp(i), power, "g^{i}");
            assert_eq!(log(power), i);
            assert!(!seen[power as usize], "g^{i} repeats an earlier power");
            seen[power as usize] = true;
            power = mul(power, 2);
        }
        assert_eq!(power, 1);
    }

    #[test]
    fn field_is_the_md_raid6_field() {
        // 0x80 * 2 overflows and reduces by 0x11d: this is what distinguishes md's field from
        // AES's (0x11b), which would give 0x1b.
        assert_eq!(mul(0x80, 2), 0x1d);
        assert_eq!(exp(8), 0x1d);
    }

    #[test]
    fn affine_matrices_multiply_by_their_constant() {
        for c in 0..=255u8 {
            for x in 0..=255u8 {
                assert_eq!(affine_byte(AFFINE_MATRIX[c as usize], x), mul(c, x), "{c} * {x}");
            }
        }
    }

    #[test]
    fn nibble_tables_multiply_by_their_constant() {
        for c in 0..=255u8 {
            let table = &NIBBLE_PRODUCTS[c as usize];
            for x in 0..=255u8 {
                let product = table[(x & 15) as usize] ^ table[16 + (x >> 4) as usize];
                assert_eq!(product, mul(c, x), "{c} * {x}");
            }
        }
    }
}
