"""The read load: the node_exporter alert expressions of VictoriaMetrics' prometheus-benchmark
(chart/files/alerts.yaml, group ``nodeexporter``, itself from awesome-prometheus-alerts), run as
instant queries every interval, four at a time, as vmalert runs that group (``concurrency: 4``)."""

from __future__ import annotations

__all__ = ["ALERT_EXPRESSIONS", "CONCURRENCY"]

CONCURRENCY = 4

ALERT_EXPRESSIONS: tuple[str, ...] = (
    "(node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes < .10)",
    "(rate(node_vmstat_pgmajfault[5m]) > 1000)",
    "node_memory_MemFree_bytes > node_memory_MemTotal_bytes * .8",
    "((rate(node_network_receive_bytes_total[5m]) / node_network_speed_bytes) > .80)",
    "((rate(node_network_transmit_bytes_total[5m]) / node_network_speed_bytes) > .80)",
    "(rate(node_disk_io_time_seconds_total[5m]) > .80)",
    '(node_filesystem_avail_bytes{fstype!~"^(fuse.*|tmpfs|cifs|nfs)"} / node_filesystem_size_bytes < .10 '
    "and on (instance, device, mountpoint) node_filesystem_readonly == 0)",
    'predict_linear(node_filesystem_avail_bytes{fstype!~"^(fuse.*|tmpfs|cifs|nfs)"}[3h], 86400) <= 0 '
    "and node_filesystem_avail_bytes > 0",
    "(node_filesystem_files_free / node_filesystem_files < .10 and ON (instance, device, mountpoint) "
    "node_filesystem_readonly == 0)",
    'node_filesystem_device_error{fstype!~"^(fuse.*|tmpfs|cifs|nfs)"} == 1',
    'predict_linear(node_filesystem_files_free{fstype!~"^(fuse.*|tmpfs|cifs|nfs)"}[1h], 86400) <= 0 '
    "and node_filesystem_files_free > 0",
    "(rate(node_disk_read_time_seconds_total[1m]) / rate(node_disk_reads_completed_total[1m]) > 0.1 "
    "and rate(node_disk_reads_completed_total[1m]) > 0)",
    "(rate(node_disk_write_time_seconds_total[1m]) / rate(node_disk_writes_completed_total[1m]) > 0.1 "
    "and rate(node_disk_writes_completed_total[1m]) > 0)",
    '1 - (avg without (cpu) (rate(node_cpu_seconds_total{mode="idle"}[5m]))) > .80',
    '(min without (cpu) (rate(node_cpu_seconds_total{mode="idle"}[1h]))) > 0.8',
    'avg without (cpu) (rate(node_cpu_seconds_total{mode="steal"}[5m])) * 100 > 10',
    'avg without (cpu) (rate(node_cpu_seconds_total{mode="iowait"}[5m])) > .10',
    "rate(node_disk_io_time_seconds_total[5m]) > 0.8",
    '(rate(node_context_switches_total[15m])/count without(mode,cpu) (node_cpu_seconds_total{mode="idle"})) '
    '/ (rate(node_context_switches_total[1d])/count without(mode,cpu) (node_cpu_seconds_total{mode="idle"})) > 2',
    "((1 - (node_memory_SwapFree_bytes / node_memory_SwapTotal_bytes)) * 100 > 80)",
    '(node_systemd_unit_state{state="failed"} == 1)',
    "node_hwmon_temp_celsius > node_hwmon_temp_max_celsius",
    "((node_hwmon_temp_crit_alarm_celsius == 1) or (node_hwmon_temp_alarm == 1))",
    '((node_md_disks_required - on(device, instance) node_md_disks{state="active"}) > 0)',
    '(node_md_disks{state="failed"} > 0)',
    "changes(node_uname_info[1h]) > 0",
    "(increase(node_vmstat_oom_kill[30m]) > 0)",
    "(increase(node_edac_correctable_errors_total[1m]) > 0)",
    "(node_edac_uncorrectable_errors_total > 0)",
    "(rate(node_network_receive_errs_total[2m]) / rate(node_network_receive_packets_total[2m]) > 0.01)",
    "(rate(node_network_transmit_errs_total[2m]) / rate(node_network_transmit_packets_total[2m]) > 0.01)",
    "((node_bonding_active - node_bonding_slaves) != 0)",
    "(node_nf_conntrack_entries / node_nf_conntrack_entries_limit > 0.8)",
    "((node_timex_offset_seconds > 0.05 and deriv(node_timex_offset_seconds[5m]) >= 0) "
    "or (node_timex_offset_seconds < -0.05 and deriv(node_timex_offset_seconds[5m]) <= 0))",
    "(min_over_time(node_timex_sync_status[1m]) == 0 and node_timex_maxerror_seconds >= 16)",
)
