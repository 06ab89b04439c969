//! Keyed permutations of `0..size` computed position by position in O(1) memory: a balanced
//! Feistel network over the smallest even number of bits that holds `size - 1`, walked until
//! it lands inside the range (cycle walking). The training loader's epoch order is built on
//! it; the Python side derives the round keys, so both agree on every element.

/// A bijection of `0..size` given by its round keys.
#[derive(Debug, Clone)]
pub struct Feistel {
    size: u64,
    half: u32,
    keys: Vec<u64>,
}

/// SplitMix64's finaliser: a bijection of 64-bit words that spreads every input bit.
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Feistel {
    /// The permutation of `0..size` (at least 1) with these round keys, over words of
    /// `2 * half` bits, the smallest even count, at least 2, that holds `size - 1`.
    pub fn new(size: u64, keys: Vec<u64>) -> Self {
        let bits = (u64::BITS - size.saturating_sub(1).leading_zeros()).max(2);
        Feistel {
            size,
            half: (bits + bits % 2) / 2,
            keys,
        }
    }

    fn low(&self) -> u64 {
        (1u64 << self.half) - 1
    }

    fn encrypt(&self, x: u64) -> u64 {
        let low = self.low();
        let (mut left, mut right) = (x >> self.half, x & low);
        for k in &self.keys {
            (left, right) = (right, left ^ (mix(right ^ k) & low));
        }
        (left << self.half) | right
    }

    fn decrypt(&self, x: u64) -> u64 {
        let low = self.low();
        let (mut left, mut right) = (x >> self.half, x & low);
        for k in self.keys.iter().rev() {
            (left, right) = (right ^ (mix(left ^ k) & low), left);
        }
        (left << self.half) | right
    }

    /// The element at `position` (or, `inverse`, the position of element `position`); `None`
    /// when `position` lies outside `0..size`.
    pub fn at(&self, position: u64, inverse: bool) -> Option<u64> {
        if position >= self.size {
            return None;
        }
        if self.size == 1 {
            return Some(0);
        }
        let step = |x| {
            if inverse {
                self.decrypt(x)
            } else {
                self.encrypt(x)
            }
        };
        // The domain is under 4 × size, so a few steps on average.
        let mut x = step(position);
        while x >= self.size {
            x = step(x);
        }
        Some(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_a_bijection_and_inverse_undoes_it() {
        for size in [1u64, 2, 3, 5, 16, 17, 1000, 4097] {
            let f = Feistel::new(size, vec![7, 11, 13, 17, 19, 23]);
            let mut seen = vec![false; size as usize];
            for p in 0..size {
                let e = f.at(p, false).unwrap();
                assert!(!seen[e as usize], "size {size}: {e} twice");
                seen[e as usize] = true;
                assert_eq!(f.at(e, true), Some(p));
            }
            assert_eq!(f.at(size, false), None);
        }
    }

    #[test]
    fn different_keys_give_different_orders() {
        let a = Feistel::new(1000, vec![1, 2, 3, 4, 5, 6]);
        let b = Feistel::new(1000, vec![1, 2, 3, 4, 5, 7]);
        let moved = (0..1000)
            .filter(|&p| a.at(p, false) != b.at(p, false))
            .count();
        assert!(moved > 900, "{moved}");
    }
}
