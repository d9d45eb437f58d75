from jaxrl_scale.pipeline import summary


def test_render_puts_the_half_budget_forecast_next_to_the_actual():
  text = summary.render({
      "outcome": "done", "signal": None, "steps": 40, "compute_hours": 0.12,
      "sft_compute_hours": 0.02, "flops": 3.2e11, "start_pass_rate": 0.31,
      "final_pass_rate": 0.86, "final_step": 40,
      "half_budget_forecast": {"made_at_step": 20, "made_at_compute_hours": 0.06,
                               "n_points": 5, "A": 0.9, "B": 2.0, "C_mid": 0.03,
                               "predicted_final": 0.84, "predicted_interval": (0.8, 0.88),
                               "predicted_at_target": 0.85, "target_compute_hours": 0.118},
  })
  assert "0.310 at step 0 (after SFT) -> 0.860 at step 40" in text
  assert "predicted pass rate at the final compute: 0.840" in text
  assert "actual: 0.860" in text
  assert "0.118 h: 0.850 [0.800, 0.880]" in text
  assert "not well determined" not in text


def test_render_flags_a_half_budget_forecast_that_is_not_well_determined():
  text = summary.render({
      "outcome": "done", "signal": None, "steps": 40, "compute_hours": 0.12,
      "sft_compute_hours": 0.0, "flops": 1.0, "start_pass_rate": 0.3, "final_pass_rate": 0.8,
      "final_step": 40,
      "half_budget_forecast": {"made_at_step": 20, "made_at_compute_hours": 0.06,
                               "n_points": 5, "A": 1.0, "B": 1.2, "C_mid": 0.2,
                               "well_determined": False, "predicted_final": 0.7},
  })
  assert "A=1.000 B=1.20 C_mid=0.200 h (not well determined" in text


def _half(axis, c_mid, target, target_hours):
  return {"made_at_step": 90, "made_at_compute_hours": 0.14, "n_points": 9, "A": 1.0,
          "B": 1.25, "C_mid": c_mid, "axis": axis, "well_determined": True,
          "predicted_final": 0.935, "predicted_interval": (0.818, 0.947),
          "predicted_at_target": 0.935, "target_compute": target,
          "target_compute_hours": target_hours}


def test_every_compute_of_the_summary_carries_its_axis_unit():
  # Issue 67 item 7: the summary printed "C_mid=0.0588" with no unit; C_mid and the
  # projected budget carry the unit of the forecast's axis, per domain too.
  base = {"outcome": "done", "signal": None, "steps": 200, "compute_hours": 0.31,
          "sft_compute_hours": 0.03, "flops": 3.3e12, "start_pass_rate": 0.42,
          "final_pass_rate": 0.94, "final_step": 200}
  text = summary.render({**base, "half_budget_forecast": _half("flops", 5.6e11, 3.3e12, 0.31)})
  assert "A=1.000 B=1.25 C_mid=5.60e+11 FLOPs" in text, text
  assert "(its forecast for the budget it projected, 3.30e+12 FLOPs (~0.310 h): 0.935" in text
  text = summary.render({**base, "half_budget_forecast": _half("hours", 0.0588, 0.311, 0.311)})
  assert "A=1.000 B=1.25 C_mid=0.059 h" in text, text
  assert "projected, 0.311 h: 0.935" in text, text
  domain = {"A": 0.9, "A_interval": (0.8, 0.95), "B": 1.5, "C_mid": 2.5e11, "R0": 0.2,
            "well_determined": True, "axis": "flops", "target_compute": 4e12,
            "target_compute_hours": None, "forecast": 0.88, "forecast_interval": (0.8, 0.9)}
  text = summary.render({**base, "final_forecast_domains": {"math": domain}})
  assert ("math: A=0.900 [0.800, 0.950] B=1.50 C_mid=2.50e+11 FLOPs R0=0.200; "
          "at 4.00e+12 FLOPs: 0.880") in text, text


def test_render_after_a_signal_says_how_to_continue():
  text = summary.render({"outcome": "signal", "signal": "SIGTERM", "steps": 7,
                         "compute_hours": 0.1, "sft_compute_hours": 0.0, "flops": 1.0})
  assert "stopped by SIGTERM after step 7" in text and "--resume" in text


def test_summary_reports_idle_fractions_and_what_compute_leaves_out(tmp_path):
  rows = [{"step": 0, "compute_hours": 0.0},
          {"step": 1, "compute_hours": 0.1, "time/step_s": 10.0, "time/wait_s": 1.0,
           "gen/idle_frac": 0.5, "time/eval_s": 3.0, "time/checkpoint_s": 0.0,
           "time/compile_s": 2.0},
          {"step": 2, "compute_hours": 0.2, "time/step_s": 30.0, "time/wait_s": 3.0,
           "gen/idle_frac": 0.1, "time/eval_s": 0.0, "time/checkpoint_s": 1.0,
           "time/compile_s": 0.0}]
  timing = summary._timing(rows)  # pylint: disable=protected-access
  assert timing == {"rl_wall_s": 40.0, "eval_s": 3.0, "checkpoint_s": 1.0, "compile_s": 2.0,
                    "trainer_idle_frac": 0.1, "generator_idle_frac": (5.0 + 3.0) / 40.0}
  text = summary.render({"outcome": "done", "signal": None, "steps": 2, "compute_hours": 0.2,
                         "sft_compute_hours": 0.0, "flops": 1.0, **timing})
  assert "eval 3s, checkpoints 1s, compiles 2s (not in compute)" in text
  assert "idle: trainer 10%, generator 20%" in text
