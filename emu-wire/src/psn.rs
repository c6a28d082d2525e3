//! Packet sequence numbers: 24 bits, modulo 2^24 (IBTA 9.7.1).

use core::cmp::Ordering;
use core::fmt;

/// A 24-bit packet sequence number with wrapping arithmetic. Comparison is defined
/// within a window of 2^23 (IBTA 9.7.1: half the PSN space is "behind", half "ahead").
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The 24 bits a PSN has.
    pub const MASK: u32 = 0x00FF_FFFF;

    /// A PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// The PSN as a number in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n`, wrapping at 2^24.
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n`, wrapping at 2^24.
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// The signed distance `self - from`, in `[-2^23, 2^23)`.
    pub const fn distance(self, from: Psn) -> i32 {
        // IBTA 9.7.1: PSNs compare modulo 2^24 within a window of 2^23; shifting the
        // 24-bit difference into the top of an i32 and back sign-extends it.
        ((self.0.wrapping_sub(from.0) << 8) as i32) >> 8
    }

    /// Orders two PSNs by the sign of their distance.
    pub fn cmp_psn(self, other: Psn) -> Ordering {
        self.distance(other).cmp(&0)
    }

    /// Whether `self` comes before `other` in the window.
    pub fn is_before(self, other: Psn) -> bool {
        self.distance(other) < 0
    }

    /// Whether `self` comes after `other` in the window.
    pub fn is_after(self, other: Psn) -> bool {
        self.distance(other) > 0
    }
}

impl core::ops::Add<u32> for Psn {
    type Output = Psn;
    fn add(self, n: u32) -> Psn {
        Psn::add(self, n)
    }
}

impl core::ops::AddAssign<u32> for Psn {
    fn add_assign(&mut self, n: u32) {
        *self = Psn::add(*self, n);
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        assert_eq!(Psn::new(0xFF_FFFF).add(1), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::new(0xFF_FFFF));
        assert_eq!(Psn::new(0).distance(Psn::new(0xFF_FFFF)), 1);
        assert_eq!(Psn::new(0xFF_FFFF).distance(Psn::new(0)), -1);
        assert!(Psn::new(3).is_after(Psn::new(0xFF_FFF0)));
        assert_eq!(Psn::new(0x80_0000).distance(Psn::new(0)), -0x80_0000);
    }

    #[test]
    fn wrap_at_0xffffff() {
        let top = Psn::new(Psn::MASK);
        assert_eq!(top.value(), 0xFF_FFFF);
        assert_eq!(top + 1, Psn::new(0));
        let mut p = top;
        p += 2;
        assert_eq!(p.value(), 1);
        assert_eq!(Psn::new(0x0100_0005), Psn::new(5));
        assert_eq!(top.add(u32::MAX), top.sub(1));
        assert!(Psn::new(0).is_after(top) && top.is_before(Psn::new(0)));
        assert_eq!(format!("{top} {top:?}"), "16777215 16777215");
        assert_eq!(Psn::default().value(), 0);
    }

    proptest! {
        #[test]
        fn distance_then_add_gets_back(a in 0u32..1 << 24, b in 0u32..1 << 24) {
            let (a, b) = (Psn::new(a), Psn::new(b));
            let d = a.distance(b);
            prop_assert!((-(1 << 23)..(1 << 23)).contains(&d));
            prop_assert_eq!(b.add(d as u32), a);
            prop_assert_eq!(b + (d as u32), a);
        }

        #[test]
        fn cmp_is_antisymmetric_within_the_window(a in 0u32..1 << 24, b in 0u32..1 << 24) {
            let (a, b) = (Psn::new(a), Psn::new(b));
            // exactly half the space apart is the one pair the window cannot order
            prop_assume!(a.distance(b) != -(1 << 23));
            prop_assert_eq!(a.cmp_psn(b), b.cmp_psn(a).reverse());
            prop_assert_eq!(a.distance(b), -b.distance(a));
            prop_assert_eq!(a.is_before(b), b.is_after(a));
            prop_assert_eq!(a.cmp_psn(b) == Ordering::Equal, a == b);
        }

        #[test]
        fn add_and_distance_are_inverse(a in 0u32..1 << 24, n in 0u32..1 << 23) {
            let p = Psn::new(a);
            prop_assert_eq!(p.add(n).distance(p), n as i32);
            prop_assert_eq!(p.add(n).sub(n), p);
            if n > 0 {
                prop_assert_eq!(p.add(n).cmp_psn(p), Ordering::Greater);
                prop_assert_eq!(p.cmp_psn(p.add(n)), Ordering::Less);
            }
        }
    }
}
