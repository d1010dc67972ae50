"""Go templates as Prometheus renders alert labels and annotations (the promtool differential covers more)."""

from __future__ import annotations

import pytest

from kernel_insight.rules.template import TemplateError, go_format_float, render


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (1.0, "1"),
        (0.5, "0.5"),
        (123456.0, "123456"),
        (1234567.0, "1.234567e+06"),
        (1e-05, "1e-05"),
        (0.0001, "0.0001"),
        (1e21, "1e+21"),
        (-2.5, "-2.5"),
        (float("nan"), "NaN"),
        (float("inf"), "+Inf"),
    ],
)
def test_values_print_as_go_prints_a_float64(value, text):
    assert go_format_float(value) == text


@pytest.mark.parametrize(
    ("template", "value", "out"),
    [
        ("{{ $value | humanizeDuration }}", 0.25, "250ms"),
        ("{{ $value | humanizeDuration }}", 3725.0, "1h 2m 5s"),
        ("{{ $value | humanizeDuration }}", 0.0, "0s"),
        ("{{ humanize $value }}", 12345678.0, "12.35M"),
        ("{{ humanize1024 $value }}", 1073741824.0, "1Gi"),
        ("{{ humanizePercentage $value }}", 0.123, "12.3%"),
        ("{{ $labels.gpu }}/{{ .Labels.gpu }}", 0.0, "3/3"),
        ('{{ if eq $labels.gpu "3" }}yes{{ else }}no{{ end }}', 0.0, "yes"),
        ("{{- /* a comment */ -}} x", 0.0, "x"),
        ("{{ $x := 2 }}{{ $x }}", 0.0, "2"),
        ('{{ printf "%.1f%%" $value }}', 12.34, "12.3%"),
    ],
)
def test_templates_render_as_prometheus_does(template, value, out):
    assert render(template, labels={"gpu": "3"}, value=value) == out


def test_a_bad_template_is_an_error_not_text():
    with pytest.raises(TemplateError, match='function "nope" not defined'):
        render("{{ nope }}")
    with pytest.raises(TemplateError):
        render("{{ if }}")
