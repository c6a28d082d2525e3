//! Crate-private helpers for the C-style enums of libibverbs.

/// Defines a fieldless `#[repr(u32)]` enum whose discriminants are the
/// libibverbs values, together with `ALL`, `as_u32()`, `TryFrom<u32>` and
/// `From<Enum> for u32`.
///
/// Every variant must be given its value explicitly, so each one can be
/// checked against `verbs.h` by eye.
macro_rules! verbs_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($cname:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $value ),+
        }

        impl $name {
            #[doc = concat!("Every `", $cname, "` value, in declaration (ascending numeric) order.")]
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            #[doc = concat!("The numeric value libibverbs uses for this `", $cname, "`.")]
            #[must_use]
            pub const fn as_u32(self) -> u32 {
                self as u32
            }
        }

        impl TryFrom<u32> for $name {
            type Error = $crate::error::UnknownValue;

            #[doc = concat!("Converts a libibverbs `", $cname, "` value; unknown values are rejected.")]
            fn try_from(value: u32) -> core::result::Result<Self, Self::Error> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_u32() == value)
                    .ok_or($crate::error::UnknownValue { type_name: $cname, value })
            }
        }

        impl From<$name> for u32 {
            fn from(v: $name) -> u32 {
                v.as_u32()
            }
        }
    };
}
