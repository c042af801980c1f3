//! Human durations as written in the attribute: `"500ms"`, `"1.5s"`, `"24h"`,
//! `"1h 30m"`. Parsed at compile time so a typo is a compile error, not a
//! panic in production.

use std::time::Duration;

/// The units a duration may use, longest name first so that `ms` is not
/// read as `m` followed by garbage.
const UNITS: &[(&str, u128)] = &[
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60 * 1_000_000_000),
    ("h", 3_600 * 1_000_000_000),
    ("d", 86_400 * 1_000_000_000),
];

/// Parses one or more `<number><unit>` parts, e.g. `"1.5s"` or `"1h 30m"`.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let hint = "write a number and a unit among ms, s, m, h, d (e.g. \"500ms\", \"1.5s\", \"24h\")";
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(format!("empty duration; {hint}"));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(f) => {
                let n = f.bytes().take_while(u8::is_ascii_digit).count();
                if n == 0 {
                    return Err(format!(
                        "`{text}` is not a duration: a digit must follow `.`; {hint}"
                    ));
                }
                f.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() {
            return Err(format!(
                "`{text}` is not a duration: expected a number; {hint}"
            ));
        }
        let after = after.trim_start();
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        let Some(&(_, nanos)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(if unit.is_empty() {
                format!("`{text}` has no unit; {hint}")
            } else {
                format!("`{text}`: unknown unit `{unit}`; {hint}")
            });
        };
        let whole: u128 = int
            .parse()
            .ok()
            .and_then(|n: u128| n.checked_mul(nanos))
            .ok_or_else(|| format!("`{text}` is too long a duration"))?;
        // Digits beyond 18 are below a nanosecond for every unit.
        let frac = &frac[..frac.len().min(18)];
        let part = if frac.is_empty() {
            0
        } else {
            frac.parse::<u128>().unwrap_or(0) * nanos / 10u128.pow(frac.len() as u32)
        };
        total = total
            .checked_add(whole + part)
            .ok_or_else(|| format!("`{text}` is too long a duration"))?;
        rest = after.trim_start();
    }
    let secs = u64::try_from(total / 1_000_000_000)
        .map_err(|_| format!("`{text}` is too long a duration"))?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// The shortest exact human form of `d` in hours at most (a default of
/// 24 h reads better as "24h" than as "1d"), for messages.
pub(crate) fn display(d: Duration) -> String {
    let nanos = d.as_nanos();
    for &(unit, size) in UNITS.iter().rev().skip(1) {
        if nanos != 0 && nanos.is_multiple_of(size) {
            return format!("{}{unit}", nanos / size);
        }
    }
    format!("{}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_decimals() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse("0.25ms"), Ok(Duration::from_micros(250)));
        assert_eq!(parse(" 1h 30m "), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse("10 s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refusals() {
        for bad in [
            "", "s", "10", "1x", "1.s", ".5s", "-1s", "1 sec", "1h-2m", "1e3s",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse("99999999999999999999999999999999999999999d").is_err());
        assert!(parse("300000000000000000000s").is_err());
    }

    #[test]
    fn display_is_exact() {
        assert_eq!(display(Duration::from_secs(86_400)), "24h");
        assert_eq!(display(Duration::from_secs(3_600)), "1h");
        assert_eq!(display(Duration::from_secs(90)), "90s");
        assert_eq!(display(Duration::from_millis(1500)), "1500ms");
        assert_eq!(display(Duration::from_nanos(1)), "0.000000001s");
    }
}
