//! DRY's repetition scan (llama.cpp's `llama_sampler_dry_apply`, from koboldcpp), the part that
//! is linear in the history: the Z-algorithm over the reversed history and, for each token that
//! would extend a repetition, the longest one it extends. The breakers' restart limit and the
//! penalties stay in `strata.dry` (Python); this loop was ~20 ms a token there over a
//! 16K-token history (llama-server's default window is the whole context).

use std::collections::HashMap;

/// For `rat` the history's last n tokens reversed (`rat[0]` the newest): every token `t` that
/// follows an earlier occurrence of the history's newest `r` tokens, with `r` = min(that
/// repetition's length, `limit`) ≥ `allowed`, and the longest such `r` — as (token, r) pairs
/// in order of first discovery (from the oldest occurrence to the newest). The repetition at
/// offset k (1 ≤ k < n) is the common prefix of `rat` and `rat[k..]` (the tokens before the
/// newest k, read backwards), and the token that followed it is `rat[k - 1]`.
pub fn dry_longest(rat: &[i32], limit: usize, allowed: usize) -> Vec<(i32, u32)> {
    let n = rat.len();
    let z = z_array(rat);
    let mut at: HashMap<i32, usize> = HashMap::new();
    let mut out: Vec<(i32, u32)> = Vec::new();
    // llama.cpp walks i = 0 .. n-2 over count[i] = z[n-1-i], i.e. k from n-1 down to 1
    for k in (1..n).rev() {
        let r = z[k].min(limit);
        if r < allowed {
            continue;
        }
        let tok = rat[k - 1];
        match at.get(&tok) {
            Some(&j) => out[j].1 = out[j].1.max(r as u32),
            None => {
                at.insert(tok, out.len());
                out.push((tok, r as u32));
            }
        }
    }
    out
}

/// z[k] = the length of the longest common prefix of `s` and `s[k..]` (z[0] = 0).
fn z_array(s: &[i32]) -> Vec<usize> {
    let n = s.len();
    let mut z = vec![0usize; n];
    let (mut lt, mut rt) = (0usize, 0usize); // the rightmost match window [lt, rt)
    for k in 1..n {
        let mut len = if k < rt { (rt - k).min(z[k - lt]) } else { 0 };
        while k + len < n && s[len] == s[k + len] {
            len += 1;
        }
        z[k] = len;
        if k + len > rt {
            (lt, rt) = (k, k + len);
        }
    }
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(rat: &[i32], limit: usize, allowed: usize) -> Vec<(i32, u32)> {
        let n = rat.len();
        let mut out: Vec<(i32, u32)> = Vec::new();
        for k in (1..n).rev() {
            let mut z = 0;
            while k + z < n && rat[z] == rat[k + z] {
                z += 1;
            }
            let r = z.min(limit);
            if r >= allowed {
                let tok = rat[k - 1];
                match out.iter_mut().find(|p| p.0 == tok) {
                    Some(p) => p.1 = p.1.max(r as u32),
                    None => out.push((tok, r as u32)),
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_quadratic_scan() {
        let mut state = 12345u64;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % m) as i32
        };
        for case in 0..300 {
            let n = 1 + (case * 7) % 97;
            let alphabet = 2 + (case % 5) as u64;
            let rat: Vec<i32> = (0..n).map(|_| next(alphabet)).collect();
            for (limit, allowed) in [(n, 0), (n, 2), (3, 1), (0, 0), (5, 4)] {
                assert_eq!(
                    dry_longest(&rat, limit, allowed),
                    naive(&rat, limit, allowed)
                );
            }
        }
    }

    #[test]
    fn a_repeated_phrase() {
        // the history 1 2 3 9 1 2, newest first: its newest two tokens "1 2" came once before,
        // followed by 3; a 3 next would extend that repetition (length 2)
        let rat = [2, 1, 9, 3, 2, 1];
        assert_eq!(dry_longest(&rat, 6, 2), vec![(3, 2)]);
        assert_eq!(dry_longest(&rat, 6, 3), vec![]);
        assert_eq!(dry_longest(&[], 6, 0), vec![]);
    }
}
