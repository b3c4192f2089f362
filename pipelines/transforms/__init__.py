"""Transforms: what each sample becomes, the same on every backend.

``spec`` is ``AugmentSpec``; ``presets`` holds ready-made torchvision v2 recipes;
``migrate`` takes a user's torchvision Compose in and translates it for DALI; ``plan`` splits
it between the workers and the device (``TransformPlan``); ``draws`` makes every per-sample
random draw on the host; ``mix`` is batch MixUp/CutMix; ``normalize`` the device-side
normalisation.
"""
