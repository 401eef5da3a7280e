# Sourced by .ci/run: a Vulkan driver for the GPU-path tests on Burn's wgpu backend
# (crates/core/tests/wgpu.rs): Mesa's software Vulkan, lavapipe (a CPU "GPU"; no GPU needed).
#
# Installs Debian's `libvulkan1` (the loader) and `mesa-vulkan-drivers` (lavapipe's ICD) when
# absent (apt-get through sudo -n when not root). If they cannot be installed, the sourcing
# shell fails (and CI with it): there is no skip. Debian 12: ~16 MB, Mesa 22.3 (Vulkan 1.3,
# shaderFloat16; no bf16). To force lavapipe next to a real GPU, set
# VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json.

echo "== lavapipe (Mesa's software Vulkan) for the wgpu tests"
kiln_lvp_icd=$(ls /usr/share/vulkan/icd.d/lvp_icd.*.json 2>/dev/null | head -n 1 || true)
if [ -z "$kiln_lvp_icd" ] || ! ldconfig -p | grep -q 'libvulkan\.so\.1'; then
  kiln_lvp_sudo=""
  if [ "$(id -u)" != 0 ]; then kiln_lvp_sudo="sudo -n"; fi
  if ! { $kiln_lvp_sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    $kiln_lvp_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libvulkan1 mesa-vulkan-drivers >/dev/null; }; then
    echo "lavapipe could not be installed (apt-get install libvulkan1 mesa-vulkan-drivers failed); the wgpu tests need it" >&2
    exit 1
  fi
  kiln_lvp_icd=$(ls /usr/share/vulkan/icd.d/lvp_icd.*.json 2>/dev/null | head -n 1 || true)
fi
if [ -z "$kiln_lvp_icd" ]; then
  echo "no lavapipe ICD under /usr/share/vulkan/icd.d after installing mesa-vulkan-drivers" >&2
  exit 1
fi
# Only lavapipe (a machine with a GPU would otherwise test its driver instead), and the
# loader's XDG warning silenced.
export VK_ICD_FILENAMES="$kiln_lvp_icd"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
echo "lavapipe ICD: $kiln_lvp_icd"
