//! A token bitmask applied to a row of logits in place (structured output: the grammar's mask
//! from llguidance, `strata.constraints`): forbidden tokens get -inf.
//!
//! Layout (llguidance's): word `i` of the mask covers tokens `32·i .. 32·i + 32`, bit `j` set
//! when token `32·i + j` is allowed. One pass over the words; a row segment is written only
//! where its word forbids something (a fill when it allows nothing), so a mask that allows
//! almost everything (inside a JSON string) costs little more than reading the mask.

/// `logits` [n]; `mask` [≥ ceil(n/32)] words (as llguidance writes them, i32). Tokens past the
/// mask's end are forbidden.
pub fn apply_token_bitmask(logits: &mut [f32], mask: &[i32]) {
    for (i, chunk) in logits.chunks_mut(32).enumerate() {
        let word = mask.get(i).map_or(0, |&w| w as u32);
        if word == u32::MAX {
            continue;
        }
        if word == 0 {
            chunk.fill(f32::NEG_INFINITY);
            continue;
        }
        for (j, x) in chunk.iter_mut().enumerate() {
            if (word >> j) & 1 == 0 {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::apply_token_bitmask;

    #[test]
    fn matches_bit_by_bit() {
        // words: all allowed, none, one token, a pattern; 3 tokens past the last full word
        let mask = [-1i32, 0, 1 << 5, 0x5555_5555u32 as i32, 0b101];
        let n = 32 * 4 + 3;
        let row: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut got = row.clone();
        apply_token_bitmask(&mut got, &mask);
        for (t, (&g, &r)) in got.iter().zip(&row).enumerate() {
            let allowed = (mask[t / 32] as u32 >> (t % 32)) & 1 == 1;
            assert_eq!(g, if allowed { r } else { f32::NEG_INFINITY }, "token {t}");
        }
        // a mask shorter than the row forbids the rest
        let mut short = row.clone();
        apply_token_bitmask(&mut short, &mask[..1]);
        assert!(short[..32].iter().zip(&row).all(|(a, b)| a == b));
        assert!(short[32..].iter().all(|&x| x == f32::NEG_INFINITY));
    }
}
