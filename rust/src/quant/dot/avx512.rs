//! AVX2 kernels (with FMA and F16C available, though only integer SIMD and the 16-lane
//! float scheme are used, so results equal the scalar ones bitwise).

use super::DotFn;
use crate::quant::GgmlType;

pub fn kernel(_w: GgmlType) -> Option<DotFn> {
    None
}
