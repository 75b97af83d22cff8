"""Device presets: the schema of data/devices.json, lookup, and this machine's calibration."""

import json

import pytest

from fusionlab.cost import calibrate, devices

ASCEND = ["Atlas 300I Pro", "Atlas 300I Duo", "Atlas 800T (Ascend 910)", "Atlas 800I A2 (Ascend 910B)"]


def test_all_four_ascend_presets_with_every_field_and_a_source():
    presets = devices.load_devices()
    assert list(presets) == ASCEND
    raw = json.loads(devices.DEVICES_JSON.read_text())["devices"]
    for entry in raw:
        for f in ("name", "chip", "peak_fp16_tflops", "peak_int8_tops", "peak_fp32_tflops", "mem_bandwidth_gbs",
                  "ub_kb", "l1_kb", "ai_cores", "power_w", "launch_overhead_us", "source", "uncertain"):
            assert f in entry, (entry["name"], f)
        assert "cann_facts.md" in entry["source"]
        assert set(entry["uncertain"]) <= set(entry)
        # an unpublished figure must be flagged, never silently filled in
        for f, v in entry.items():
            if v is None:
                assert f in entry["uncertain"], (entry["name"], f)
    # published figures (cann_facts.md s4 and s3.3)
    pro = presets["Atlas 300I Pro"]
    assert (pro.peak_fp16_tflops, pro.mem_bandwidth_gbs, pro.ub_kb, pro.ai_cores) == (70.0, 204.8, 256, 8)
    a2 = presets["Atlas 800I A2 (Ascend 910B)"]
    assert (a2.chip, a2.peak_fp16_tflops, a2.mem_bandwidth_gbs, a2.ub_kb, a2.ai_cores) == ("Ascend 910B4", 280.0, 800.0, 192, 20)
    assert "peak_fp16_tflops" in presets["Atlas 300I Duo"].uncertain  # 2 x 70 is derived
    assert "mem_bandwidth_gbs" in presets["Atlas 800T (Ascend 910)"].uncertain


def test_get_is_case_insensitive_and_errors_list_the_names():
    assert devices.get("atlas 300i pro").name == "Atlas 300I Pro"
    assert devices.get("ASCEND 910B4").name == "Atlas 800I A2 (Ascend 910B)"
    with pytest.raises(ValueError) as exc:
        devices.get("Atlas 9000")
    msg = str(exc.value)
    assert "\n" not in msg and all(n in msg for n in ASCEND) and "this machine" in msg


def test_a_broken_preset_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "devices.json"
    entry = json.loads(devices.DEVICES_JSON.read_text())["devices"][0]
    del entry["mem_bandwidth_gbs"]
    bad.write_text(json.dumps({"devices": [entry]}))
    with pytest.raises(ValueError, match="lacks fields.*mem_bandwidth_gbs"):
        devices.load_devices(bad)
    entry["mem_bandwidth_gbs"] = -1
    bad.write_text(json.dumps({"devices": [entry]}))
    with pytest.raises(ValueError, match="positive"):
        devices.load_devices(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        devices.load_devices(bad)


def test_roofline_helpers():
    pro = devices.get("Atlas 300I Pro")
    assert pro.buffer_bytes == (256 + 1024) * 1024 * 8
    assert pro.ridge_flop_per_byte == pytest.approx(70e12 / 204.8e9)
    assert pro.peak_flops("float32") == 70e12  # no fp32 figure: the cube runs fp32 models as fp16
    assert devices.get("Atlas 800I A2").peak_flops("float32") == 75e12
    assert pro.peak_flops("int8") == 140e12


@pytest.mark.slow
def test_calibration_returns_positive_numbers_and_is_cached():
    c = calibrate.calibrate(quick=True)
    assert c.matmul_gflops > 0 and c.copy_gbs > 0 and c.add_gbs > 0 and c.launch_overhead_us > 0
    assert c.stream_gbs == max(c.copy_gbs, c.add_gbs)
    assert calibrate.calibrate(quick=True) is c
    me = devices.this_machine()
    assert me.name == "this machine" and me.precision == "fp32"
    assert me.mem_bandwidth_gbs == c.stream_gbs and me.peak_fp32_tflops == pytest.approx(c.matmul_gflops / 1e3)
    assert devices.get("This Machine") == me


def test_one_chip_of_a_multi_chip_card_is_what_one_model_runs_on():
    duo = devices.get("Atlas 300I Duo")
    chip = duo.one_chip()
    pro = devices.get("Atlas 300I Pro")  # one 310P3 on a card of its own
    assert duo.chips == 2 and chip.chips == 1 and chip.chip == "Ascend 310P3" and "one chip" in chip.name
    assert chip.mem_bandwidth_gbs == pytest.approx(duo.mem_bandwidth_gbs / 2)
    assert chip.peak_flops("float16") == pytest.approx(duo.peak_flops("float16") / 2) == pytest.approx(pro.peak_flops("float16"))
    assert chip.peak_int8_tops == pytest.approx(pro.peak_int8_tops) and chip.ai_cores == pro.ai_cores
    assert chip.ub_kb == duo.ub_kb and chip.launch_overhead_us == duo.launch_overhead_us
    # the card's efficiency is the chip's: both halve
    assert chip.peak_int8_tops / chip.power_w == pytest.approx(duo.peak_int8_tops / duo.power_w)
    assert "power_w" in chip.uncertain and "power_w" not in duo.uncertain  # the per-chip power is derived
    # a chip's share of bandwidth per core does not depend on the view
    assert chip.bandwidth / chip.ai_cores == pytest.approx(duo.bandwidth / duo.ai_cores)
    for dev in devices.load_devices().values():
        if dev.chips == 1:
            assert dev.one_chip() is dev
        assert dev.one_chip().one_chip() == dev.one_chip()
