# scaled_crop alone (library='pil'), the draft request before 6e1ee0b ('old': ceiling of size / k) against after ('new': size // k),
# 40 photos of 2000-4000 px (python -m data_gen --out W --num-images 40 --classes 2 --seed 0 --width-range 2000,4000),
# RandomResizedCrop(224), one thread, the two alternating for 6 rounds (the order reversed every other round):
# old median 36.36 ms/img range 32.10-43.88
# new median 27.48 ms/img range 24.05-30.69
# old/new 1.323

import glob, io, time, statistics, sys, torch
from PIL import Image
from torchvision.transforms import v2
from pipelines.torch_backend import decode as D
torch.set_num_threads(1)
t = v2.RandomResizedCrop(224, antialias=True)
files = [open(f, "rb").read() for f in sorted(glob.glob(sys.argv[1] + "/*/*.jpg"))[:40]]
real_draft = Image.Image.draft
from PIL import JpegImagePlugin
jd = JpegImagePlugin.JpegImageFile.draft
def ceil_draft(im, mode, size):  # the old request: ceil(size / k)
    W, H = im.size
    k = round(W / size[0]) if size[0] else 1
    return jd(im, mode, (-(-W // k), -(-H // k)))
def run(kind):
    JpegImagePlugin.JpegImageFile.draft = ceil_draft if kind == "old" else jd
    torch.manual_seed(0)
    t0 = time.perf_counter()
    for d in files:
        D.scaled_crop(d, t, library="pil")
    return (time.perf_counter() - t0) / len(files) * 1e3
res = {"old": [], "new": []}
for r in range(int(sys.argv[2])):
    for kind in (("old", "new") if r % 2 == 0 else ("new", "old")):
        res[kind].append(run(kind))
for k, v in res.items():
    print(k, "median %.2f ms/img" % statistics.median(v), "range %.2f-%.2f" % (min(v), max(v)))
print("old/new %.3f" % (statistics.median(res["old"]) / statistics.median(res["new"])))
