//! Sizes and rates as people type them (`64K`, `256MiB`, `2G`, `200M/s`) and as the CLI prints
//! them.
//!
//! Suffixes follow dd: `K`, `M`, `G`, `T` and `KiB`, `MiB`, ... are powers of 1024; `KB`, `MB`,
//! ... are powers of 1000. A bare number is bytes. Throughput is printed in MB/s (10^6 bytes per
//! second, as fio and iostat print it); sizes in KiB/MiB/GiB.

/// Parses a byte count such as `4096`, `64K`, `1M`, `256MiB`, `2G` or `1GB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    let hint = "use a whole number with an optional suffix: K, M, G, T (powers of 1024) or KB, MB, GB, TB (powers of 1000)";
    if digits.is_empty() {
        return Err(format!("'{text}' is not a size: {hint}"));
    }
    let number: u64 = digits.parse().map_err(|_| format!("'{text}' is too large"))?;
    let multiplier: u64 = match suffix.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "kiB" => 1 << 10,
        "M" | "m" | "MiB" => 1 << 20,
        "G" | "g" | "GiB" => 1 << 30,
        "T" | "t" | "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(format!("'{text}' has an unknown suffix '{suffix}': {hint}")),
    };
    number.checked_mul(multiplier).ok_or_else(|| format!("'{text}' is too large"))
}

/// Parses a rate in bytes per second: a size with an optional `/s` (`200M`, `500MB/s`).
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let without = text.trim().strip_suffix("/s").unwrap_or(text.trim());
    let rate = parse_size(without)?;
    if rate == 0 {
        return Err(format!("rate '{text}' must be above zero"));
    }
    Ok(rate)
}

/// `1.5 GiB`, `64 KiB`, `512 B`: binary units with one decimal where it matters.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Throughput in MB/s (10^6 bytes per second).
pub fn format_rate(bytes_per_s: u64) -> String {
    let mb = bytes_per_s as f64 / 1e6;
    if mb >= 100.0 { format!("{mb:.0} MB/s") } else { format!("{mb:.1} MB/s") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_and_decimal_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size(" 8 k "), Ok(8192));
    }

    #[test]
    fn bad_sizes_say_what_to_type() {
        for bad in ["", "M", "12X", "1.5G", "-4K", "99999999999999999999"] {
            let err = parse_size(bad).expect_err(bad);
            assert!(err.contains(bad.trim()), "{err}");
        }
        assert!(parse_size("99999999T").is_err(), "overflow must be refused");
    }

    #[test]
    fn rates_accept_per_second_and_refuse_zero() {
        assert_eq!(parse_rate("200M"), Ok(200 << 20));
        assert_eq!(parse_rate("500MB/s"), Ok(500_000_000));
        assert!(parse_rate("0").is_err());
    }

    #[test]
    fn formatting_picks_readable_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(64 << 10), "64 KiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_rate(310_000_000), "310 MB/s");
        assert_eq!(format_rate(1_500_000), "1.5 MB/s");
    }
}
