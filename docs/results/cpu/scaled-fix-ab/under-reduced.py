# short of the chosen reduction: 183 of 200 crops; (chosen k, decoded k): count {(4, 2): 98, (2, 1): 15, (8, 4): 70, (4, 4): 16, (8, 8): 1}
# How often the draft request before 6e1ee0b (the ceiling of size / k) fell short of the reduction k
# that scaled_crop chose: RandomResizedCrop(224), 5 crops (seeded) of each of 40 photos of 2000-4000 px
# (python -m data_gen --out W --num-images 40 --classes 2 --seed 0 --width-range 2000,4000).
# Run: python under-reduced.py W ; its output is at the top of this file.
import glob, io, sys, torch
from PIL import Image
from torchvision.transforms import v2
from pipelines.torch_backend.decode import _params, reduction
t = v2.RandomResizedCrop(224, antialias=True)
short = total = 0
pairs = {}
torch.manual_seed(0)
for f in sorted(glob.glob(sys.argv[1] + "/*/*.jpg"))[:40]:
    data = open(f, "rb").read()
    for _ in range(5):
        im = Image.open(io.BytesIO(data))
        W, H = im.size
        p = _params(t, H, W)
        k = reduction(p["height"], p["width"], 224, 224)
        if k > 1:
            im.draft("RGB", (-(-W // k), -(-H // k)))
        got = round(W / im.size[0])
        total += 1
        short += got < k
        pairs[(k, got)] = pairs.get((k, got), 0) + 1
print(f"short of the chosen reduction: {short} of {total} crops; (chosen k, decoded k): count {pairs}")
