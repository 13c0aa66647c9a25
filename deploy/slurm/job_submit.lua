--[[
slurm-k8s-bridge job_submit.lua

For jobs in a bridged partition (their nodes are Kubernetes nodes):
  * reject what cannot run there, with a message on sbatch's stderr:
    heterogeneous jobs, jobs with no image, bad #K8S directives, root's jobs
    (pods never run as root); allocations without a script (salloc, srun) pass:
    their pods start with their first step (the image from that step's
    SLURM_K8S_IMAGE or the partition's default);
  * keep the login environment from being built on the slurmd host
    (--get-user-env, --export=NONE: `su - user` there).
The batch script stays the user's, as Slurm keeps and shows it (`scontrol write
batch_script`): on a bridged node the step guard (deploy/slurm/spank) starts the
bridge's waiter in its place, which hands it to the bridge to run in pods.
slurm_job_modify refuses to move a job into or out of a bridged partition: the
checks above were made for the partitions it was submitted to.

Settings come from job_submit_bridge.conf beside this file (written by the
bridge's installer from its config, so both agree):
  attach_command=<command line that starts the waiter>
  directive_keys=image,pull_policy,...
  partition=<name> [default_image=<image>]
Without a readable settings file every job is refused (this plugin fails
closed: it cannot tell which partitions are bridged).
]]

local SETTINGS_NAME = "job_submit_bridge.conf"

local function here()
  local source = debug.getinfo(1, "S").source
  return source:match("^@(.*/)") or "./"
end

local function settings_path()
  return here() .. SETTINGS_NAME
end

-- The settings, or nil and why not.
local function load_settings()
  local settings = { partitions = {}, keys = {} }
  local file, problem = io.open(settings_path(), "r")
  if not file then
    return nil, problem
  end
  for raw in file:lines() do
    local line = raw:gsub("#.*$", ""):match("^%s*(.-)%s*$")
    local key, value = line:match("^([%w_]+)=(.*)$")
    if key == "attach_command" then
      settings.attach_command = value
    elseif key == "directive_keys" then
      for k in value:gmatch("[^,%s]+") do settings.keys[k] = true end
    elseif key == "partition" then
      local name, rest = value:match("^(%S+)%s*(.*)$")
      settings.partitions[name] = { default_image = rest:match("default_image=(%S+)") }
    end
  end
  file:close()
  if settings.attach_command == nil or settings.attach_command == "" then
    return nil, settings_path() .. ": no attach_command line"
  end
  return settings
end

local function refuse_without_settings(problem)
  slurm.log_user("slurm-k8s-bridge: no job is accepted: cannot read the bridge's settings (%s). "
    .. "Ask the administrators to install %s (slurm-k8s-bridge job-submit-conf).", problem, settings_path())
  slurm.log_error("slurm-k8s-bridge: refusing jobs, settings unreadable: %s", problem)
  return slurm.ERROR
end

local function bridged_in(settings, names)
  local bridged, plain = {}, {}
  for _, name in ipairs(names) do
    if settings.partitions[name] then bridged[#bridged + 1] = name else plain[#plain + 1] = name end
  end
  return bridged, plain
end

-- A component of a heterogeneous job (sbatch ... : ..., or #SBATCH hetjob).
local function is_het_component(job_desc)
  local offset = job_desc.het_job_offset
  return offset ~= nil and offset ~= slurm.NO_VAL and offset ~= 4294967294 and offset ~= 4294967295
end

local function split_commas(text)
  local out = {}
  for item in (text or ""):gmatch("[^,]+") do out[#out + 1] = item end
  return out
end

-- The partitions the job will run in: those it asked for, else its reservation's (slurmctld picks
-- that after this plugin ran), else the default one; each with its Alternate partition, which
-- slurmctld may move it to.
local function requested_partitions(job_desc, part_list)
  local names = {}
  if job_desc.partition ~= nil and job_desc.partition ~= "" then
    names = split_commas(job_desc.partition)
  elseif job_desc.reservation ~= nil and job_desc.reservation ~= "" then
    for _, name in ipairs(split_commas(job_desc.reservation)) do
      local resv = slurm.reservations and slurm.reservations[name]
      if resv ~= nil and resv.partition ~= nil and resv.partition ~= "" then
        names[#names + 1] = resv.partition
      end
    end
  end
  if #names == 0 then
    for _, part in pairs(part_list) do
      if part.flag_default == 1 or part.flag_default == true then names = { part.name } end
    end
  end
  local with_alternates = {}
  for _, name in ipairs(names) do
    with_alternates[#with_alternates + 1] = name
    for _, part in pairs(part_list) do
      if part.name == name and part.alternate ~= nil and part.alternate ~= "" then
        with_alternates[#with_alternates + 1] = part.alternate
      end
    end
  end
  return with_alternates
end

-- #K8S directives live in the leading comment block, like #SBATCH.
local function parse_directives(script, allowed)
  local found, number = {}, 0
  for line in (script .. "\n"):gmatch("(.-)\r?\n") do
    number = number + 1
    if not (number == 1 and line:match("^#!")) then
      if line:match("^%s*$") then
        -- blank lines do not end the header
      elseif not line:match("^#") then
        break
      elseif line:match("^#K8S") then
        local body = line:match("^#K8S%s+(.*)$")
        if not body or body:match("^%s*$") then
          return nil, string.format("line %d: '#K8S' needs key=value pairs", number)
        end
        for token in body:gmatch("%S+") do
          local key, value = token:match("^([%w_%-]+)=(.+)$")
          if not key then
            return nil, string.format("line %d: '%s' is not key=value", number, token)
          end
          if not allowed[key] then
            local names = {}
            for k in pairs(allowed) do names[#names + 1] = k end
            table.sort(names)
            return nil, string.format("line %d: unknown #K8S key '%s' (known: %s)", number, key,
              table.concat(names, ", "))
          end
          found[key] = value
        end
      end
    end
  end
  return found
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local settings, problem = load_settings()
  if settings == nil then
    return refuse_without_settings(problem)
  end
  local bridged, plain = bridged_in(settings, requested_partitions(job_desc, part_list))
  if #bridged == 0 then
    return slurm.SUCCESS
  end
  local prefix = "slurm-k8s-bridge: partition " .. bridged[1] .. " runs jobs in Kubernetes: "
  if #plain > 0 then
    slurm.log_user(prefix .. "do not mix it with non-Kubernetes partitions (%s)", table.concat(plain, ","))
    return slurm.ERROR
  end
  if is_het_component(job_desc) then
    slurm.log_user(prefix .. "heterogeneous jobs cannot run there; submit the components as separate jobs")
    return slurm.ERROR
  end
  if job_desc.container ~= nil and job_desc.container ~= "" then
    -- An OCI bundle would run as the batch step on the slurmd host, with the user's rootfs.
    slurm.log_user(prefix .. "--container cannot be used there; the job's image is '#K8S image=...'")
    return slurm.ERROR
  end
  if job_desc.user_id == 0 or submit_uid == 0 then
    slurm.log_user(prefix .. "jobs of root are refused (pods never run as root); submit as a user")
    return slurm.ERROR
  end
  if job_desc.script == nil or job_desc.script == "" then
    -- salloc or a bare srun: an allocation. Its pods start with its first step, in the image of
    -- that step's SLURM_K8S_IMAGE (else the partition's default); the SPANK guard turns every
    -- step's tasks into the bridge's proxies, so nothing of the user's runs on the slurmd.
    return slurm.SUCCESS
  end
  local directives, problem = parse_directives(job_desc.script, settings.keys)
  if directives == nil then
    slurm.log_user(prefix .. "bad #K8S directive, %s", problem)
    return slurm.ERROR
  end
  for _, name in ipairs(bridged) do
    if directives.image == nil and settings.partitions[name].default_image == nil then
      slurm.log_user(prefix .. "no container image: add a line '#K8S image=<image>' to the script "
        .. "(partition %s has no default image)", name)
      return slurm.ERROR
    end
  end
  -- slurmd builds the environment of a job with SLURM_GET_USER_ENV=1 (sbatch --get-user-env,
  -- --export=NONE or a list, scrontab) by running `su - <user>`, the user's login scripts, on its
  -- own host. Never on a bridged node's: the pod gets the exported environment as it is.
  local env = job_desc.environment
  if env ~= nil and env.SLURM_GET_USER_ENV ~= nil and env.SLURM_GET_USER_ENV ~= "0" then
    env.SLURM_GET_USER_ENV = "0"
    slurm.log_user(prefix .. "the login environment is not built for it (--get-user-env, "
      .. "--export=NONE or a list of variables); the pod gets the exported variables and the "
      .. "image's own")
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local new_partition = job_desc.partition
  if new_partition == nil or new_partition == "" or new_partition == job_rec.partition then
    return slurm.SUCCESS
  end
  local settings, problem = load_settings()
  if settings == nil then
    return refuse_without_settings(problem)
  end
  local new_bridged, new_plain = bridged_in(settings, split_commas(new_partition))
  local old_bridged, old_plain = bridged_in(settings, split_commas(job_rec.partition))
  -- Between bridged partitions the checks hold; a move from a plain one would skip them (a login
  -- environment built on the slurmd host, a job with no image, root's job).
  if (#new_bridged > 0 or #old_bridged > 0) and (#new_plain > 0 or #old_plain > 0) then
    slurm.log_user("slurm-k8s-bridge: job %u cannot move from partition %s to %s: jobs cannot move "
      .. "into or out of a partition that runs in Kubernetes; submit it again there instead",
      job_rec.job_id, job_rec.partition or "?", new_partition)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

slurm.log_info("slurm-k8s-bridge job_submit.lua loaded")
return slurm.SUCCESS
