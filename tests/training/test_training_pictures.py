"""Pictures while training: each statistics pass (bounded by stats.picture_passes) sends the attention maps and a
few heatmaps to TensorBoard, so heads can be watched forming; the end of the run writes the interactive page."""

from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator


def test_pictures_reach_tensorboard_at_each_statistics_pass(train, tmp_path):
    r = train("logger=tensorboard", "stats.plots=true", "stats.every_n_steps=1", "stats.picture_passes=2",
              "trainer.limit_train_batches=4", "model.n_layers=2", "attention.n_heads=4", "attention.n_kv_heads=2")
    assert r.returncode == 0, r.stderr[-2000:]
    run_dir = next(tmp_path.rglob("summary.json")).parent
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={IMAGES: 0})
    events.Reload()
    maps = events.Images("attn/attention_maps")
    # passes at steps 1-4 and the validation end; picture_passes=2 spreads them over the 4 steps (every 2nd),
    # then the end of training adds the final pictures
    steps = [e.step for e in maps]
    assert len(steps) == 3 and steps[0] < steps[1] <= steps[2] == 4, steps
    assert all(e.width <= 1200 for e in maps)
    assert [e.step for e in events.Images("attn/stat_entropy_norm")][:2] == steps[:2]
    page = (run_dir / "plots" / "attention.html").read_text()
    assert "KV head 1" in page or '"n_kv_heads":2' in page
