import pytest

from vnetbench.units import UnitError, format_rate, parse_duration, parse_rate, parse_size


@pytest.mark.parametrize("text,bps", [
    ("100Mbit", 100e6), ("1.25Gbit", 1.25e9), ("500kbit", 500e3), ("10mbit", 10e6),
    ("1Tbit", 1e12), ("12.5MBps", 100e6), ("64000", 64000.0), (1000, 1000.0),
])
def test_rates(text, bps):
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("text,size", [
    ("500kB", 500_000), ("1500B", 1500), ("64KiB", 65536), ("1MB", 1e6), ("2MiB", 2 * 1024**2), (1514, 1514),
])
def test_sizes(text, size):
    assert parse_size(text) == pytest.approx(size)


@pytest.mark.parametrize("text,seconds", [
    ("20s", 20), ("300us", 300e-6), ("1.5ms", 1.5e-3), ("2min", 120), ("250ns", 250e-9), (3, 3.0),
])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["100Mbt", "fast", "", "Mbit", "1e", "10 parsecs"])
def test_bad_rates_say_what_is_expected(bad):
    with pytest.raises(UnitError) as e:
        parse_rate(bad)
    assert "Mbit" in str(e.value) and repr(bad) in str(e.value)


def test_bad_size_and_duration():
    with pytest.raises(UnitError, match="size unit"):
        parse_size("5kbit")
    with pytest.raises(UnitError, match="duration"):
        parse_duration("5 fortnights")


def test_format_rate_round_trips():
    for v in (100e6, 1.25e9, 500e3, 64):
        assert parse_rate(format_rate(v)) == pytest.approx(v)


def test_one_percentage_parser_and_one_time_format_serve_every_caller():
    from vnetbench.units import parse_percent, utc_iso, utc_text

    assert parse_percent("5%") == pytest.approx(0.05) and parse_percent(" 0.05 ") == 0.05
    assert parse_percent("150%") == 1.5 and parse_percent("2") == 2.0  # each caller checks its own range
    for bad in ("five", "%", "nan%", ""):
        with pytest.raises(UnitError):
            parse_percent(bad)
    # People and programs see the same instant, in UTC, wherever it is shown.
    assert utc_text(0) == "-" and utc_text(None, missing="—") == "—"
    assert utc_text(1_764_036_665) == "2025-11-25 02:11:05 UTC"
    assert utc_text(1_764_036_665, seconds=False) == "2025-11-25 02:11 UTC"
    assert utc_iso(1_764_036_665) == "2025-11-25T02:11:05+00:00" and utc_iso(None) is None
