"""The built-in synthetic dataset: classes are defined by motion, appearance is shared across classes.

It poses, in miniature, the problem CoCLR is about. Every clip shows a textured background and a few textured
foreground objects. The *class* is how the objects move (translate up, zoom in, oscillate, spin, ...); the
*appearance* (background texture and palette, object shapes, colours and sizes, lighting) belongs to a
*scene*, and each scene performs several classes. Train and test use disjoint scenes, so appearance cannot
tell the classes apart: an RGB network trained by instance discrimination is tempted to cluster by
appearance, while optical flow sees the motion. (``actor_cue`` > 0 adds appearance that correlates with the
class, each class's typical actor: an object shape and colours, as real actions have typical actors.)

Like UCF101, the clips of one (scene, action) pair are consecutive segments of one continuous source video
(a *group*: ``scene0003_zoom_in``), and entries are keyed ``scene0003/zoom_in/c01``.

Every class is invariant under a horizontal flip (training augmentation flips clips, and CoCLR pairs flipped
and unflipped views of one video), so there is "translate_horizontal" rather than left and right, and
"rotate" and "circle" in either sense.

Each clip is a pure function of ``(config, clip key)``: randomness comes from generators seeded with the
seed and the names of the scene, group and clip, so parallel or resumed generation gives identical bytes.
Rendering is vectorised NumPy over all frames of a clip, with analytic, band-limited textures and
anti-aliased shape edges, so that motion is sub-pixel smooth and optical flow can follow it.

Example::

    config = load_config(SynthConfig, overrides=["frames=16"])
    summary = generate_synthetic("data/synth", config, workers=2)
"""

from coclr.synth.config import (
                                     ACTORS,
                                     BACKGROUNDS,
                                     MOTIONS,
                                     SHAPES,
                                     ClipSpec,
                                     SynthConfig,
                                     clip_key,
                                     dataset_clips,
                                     named_rng,
                                     parse_key,
                                     scene_actions,
                                     scene_name,
)
from coclr.synth.output import (
                                     SynthClipJob,
                                     SynthSummary,
                                     generate_synthetic,
                                     random_store,
                                     recorded_options,
                                     synthetic_index,
                                     write_videos,
)
from coclr.synth.render import actor_colours, render_clip, scene_style

__all__ = ["ACTORS", "BACKGROUNDS", "MOTIONS", "SHAPES", "ClipSpec", "SynthClipJob", "SynthConfig", "SynthSummary",
           "actor_colours", "clip_key", "dataset_clips", "generate_synthetic", "named_rng", "parse_key",
           "random_store", "recorded_options", "render_clip", "scene_actions", "scene_name", "scene_style",
           "synthetic_index", "write_videos"]
